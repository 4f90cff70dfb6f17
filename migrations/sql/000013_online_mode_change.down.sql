ALTER TABLE outbox_topics DROP COLUMN IF EXISTS mode_changed_below;

DROP INDEX IF EXISTS outbox_failing_idx;
ALTER TABLE outbox DROP COLUMN IF EXISTS failing_since;
DROP INDEX IF EXISTS outbox_dead_letters_group_idx;
DROP INDEX IF EXISTS outbox_ordered_idx;
ALTER TABLE outbox DROP COLUMN IF EXISTS ordered;
ALTER TABLE outbox_topics
    DROP COLUMN IF EXISTS ordered_dead_letters,
    DROP COLUMN IF EXISTS ordered;

-- A PUB_SUB topic's tracking mode can change while groups and producers
-- run. Each message row says how it is tracked by which columns it
-- carries (required_bits: Bitmap; required_ids: Counter; neither:
-- Offset), so the rows written before a change keep theirs. Until none of
-- them is left, groups complete, and cleanup judges, every row by its
-- own columns. mode_changed_below marks that time: every row written
-- under an earlier mode has an xid below it (NULL: every stored row
-- follows tracking_mode).
ALTER TABLE outbox_topics ADD COLUMN mode_changed_below xid8;

-- Databases migrated with earlier texts of migrations 1 and 2 stored '{}'
-- headers and zero PUB_SUB counters on every row. Make them NULL-able
-- without defaults, as migrations 1 and 2 now create them (a no-op there).
ALTER TABLE outbox
    ALTER COLUMN headers DROP NOT NULL,
    ALTER COLUMN headers DROP DEFAULT,
    ALTER COLUMN done_bits DROP NOT NULL,
    ALTER COLUMN done_bits DROP DEFAULT,
    ALTER COLUMN completed_count DROP NOT NULL,
    ALTER COLUMN completed_count DROP DEFAULT;

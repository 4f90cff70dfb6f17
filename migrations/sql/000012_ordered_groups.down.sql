DROP INDEX IF EXISTS outbox_group_retries_failing_idx;
ALTER TABLE outbox_group_retries DROP COLUMN IF EXISTS failing_since;
DROP INDEX IF EXISTS outbox_group_retries_ungrouped_idx;
DROP INDEX IF EXISTS outbox_group_retries_leased_idx;
DROP INDEX IF EXISTS outbox_group_retries_group_idx;

DROP INDEX IF EXISTS outbox_group_retries_group_idx;

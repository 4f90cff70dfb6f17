DROP INDEX IF EXISTS outbox_published_priority_idx;
DROP TABLE IF EXISTS outbox_group_set_aside;

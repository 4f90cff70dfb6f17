DROP TABLE outbox_live_instances;

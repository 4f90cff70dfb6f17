-- Fails while a QUEUE topic lives on the log.
ALTER TABLE outbox_topics DROP CONSTRAINT outbox_topics_tracking_check;
ALTER TABLE outbox_topics ADD CONSTRAINT outbox_topics_check
    CHECK ((semantics = 'PUB_SUB') = (tracking_mode IS NOT NULL));

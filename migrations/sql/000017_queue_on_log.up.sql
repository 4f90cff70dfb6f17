-- A QUEUE topic's messages may live on the log (outbox_published), read
-- by the topic's one consumer group, whose tracking mode is OFFSET: a
-- QUEUE topic has no tracking mode, or OFFSET; a PUB_SUB topic has one.
ALTER TABLE outbox_topics DROP CONSTRAINT outbox_topics_check;
ALTER TABLE outbox_topics ADD CONSTRAINT outbox_topics_tracking_check
    CHECK (CASE semantics WHEN 'PUB_SUB' THEN tracking_mode IS NOT NULL
                          ELSE tracking_mode IS NULL OR tracking_mode = 'OFFSET' END);

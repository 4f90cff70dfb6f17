INSERT INTO bench_pgoutbox.outbox (topic, payload, headers, correlation_id, message_group, priority) VALUES ('w1q', '{"seq": 1}', NULL, 'c0ffee00-0000-4000-8000-000000000000', NULL, 0) RETURNING id;

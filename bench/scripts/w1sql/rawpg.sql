INSERT INTO bench_rawpg.outbox (topic, payload) VALUES ('w1', '{"seq": 1, "body": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}');

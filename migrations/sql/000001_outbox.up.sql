-- Topic configuration. A topic without a row here is a QUEUE topic with the
-- library's defaults.
CREATE TABLE outbox_topics (
    topic           text        PRIMARY KEY,
    semantics       text        NOT NULL CHECK (semantics IN ('QUEUE', 'PUB_SUB')),
    tracking_mode   text        CHECK (tracking_mode IN ('BITMAP', 'COUNTER', 'OFFSET')),
    retention       interval    NOT NULL,
    max_attempts    integer     NOT NULL CHECK (max_attempts > 0),
    backoff_initial interval    NOT NULL,
    backoff_max     interval    NOT NULL,
    lease_duration  interval    NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((semantics = 'PUB_SUB') = (tracking_mode IS NOT NULL))
);

-- Every message of every topic. QUEUE messages are deleted when acked;
-- dead-lettered ones stay (status DEAD_LETTER) until replayed or purged.
CREATE TABLE outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic           text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb,      -- NULL when a message has none
    correlation_id  text        NOT NULL,
    message_group   text,
    priority        smallint    NOT NULL DEFAULT 0,
    idempotency_key text,
    status          text        NOT NULL DEFAULT 'PENDING'
                                CHECK (status IN ('PENDING', 'PROCESSING', 'DEAD_LETTER')),
    attempts        integer     NOT NULL DEFAULT 0,
    available_at    timestamptz NOT NULL DEFAULT now(),
    lease_owner     text,
    lease_until     timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    dead_lettered_at timestamptz,
    -- The writing transaction: commit order is not id order, so cursor
    -- readers use this (DESIGN.md, "Commit order is not id order").
    xid             xid8        NOT NULL DEFAULT pg_current_xact_id()
);

-- Claiming: highest priority first, then the longest available.
CREATE INDEX outbox_claim_idx ON outbox (topic, priority DESC, available_at, id)
    WHERE status = 'PENDING';
-- Reclaiming expired leases.
CREATE INDEX outbox_lease_idx ON outbox (topic, lease_until)
    WHERE status = 'PROCESSING';
-- Listing and replaying dead letters.
CREATE INDEX outbox_dead_letter_idx ON outbox (topic, id)
    WHERE status = 'DEAD_LETTER';
-- Idempotent sends: one live message per (topic, key).
CREATE UNIQUE INDEX outbox_idempotency_idx ON outbox (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

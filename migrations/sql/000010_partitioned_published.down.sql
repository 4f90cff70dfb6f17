-- Back to one table (an identity column, outbox_id_seq its sequence): the
-- rows of every partition are copied into it.
LOCK TABLE outbox_published, outbox IN ACCESS EXCLUSIVE MODE;

ALTER TABLE outbox_published RENAME TO outbox_published_parted;
ALTER INDEX outbox_published_xid_idx RENAME TO outbox_published_parted_xid_idx;
ALTER INDEX outbox_published_pkey RENAME TO outbox_published_parted_pkey;
CREATE TABLE outbox_published (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic            text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb,
    correlation_id   text        NOT NULL,
    message_group    text,
    priority         smallint    NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'PENDING',
    attempts         integer     NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_until      timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    dead_lettered_at timestamptz,
    xid              xid8        NOT NULL DEFAULT pg_current_xact_id(),
    required_bits    bigint,
    done_bits        bigint,
    required_ids     bigint[],
    required_count   integer,
    completed_count  integer
);
INSERT INTO outbox_published OVERRIDING SYSTEM VALUE SELECT * FROM outbox_published_parted;
CREATE INDEX outbox_published_xid_idx ON outbox_published (topic, xid, id);
DROP TABLE outbox_published_parted;
DROP TABLE outbox_partitions;

SELECT setval('outbox_published_id_seq', last_value, is_called) FROM outbox_id_seq;
ALTER TABLE outbox ALTER COLUMN id SET DEFAULT nextval('outbox_published_id_seq');
DROP SEQUENCE outbox_id_seq;
ALTER SEQUENCE outbox_published_id_seq RENAME TO outbox_id_seq;

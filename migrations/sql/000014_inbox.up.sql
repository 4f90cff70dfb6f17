-- The inbox (package inbox): which messages a consumer already handled,
-- by key, recorded in the handler's transaction. A key is kept until
-- expires_at; the maintenance service deletes it after that.
CREATE TABLE outbox_inbox (
    inbox       text        NOT NULL,
    key         text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (inbox, key)
);
CREATE INDEX outbox_inbox_expiry_idx ON outbox_inbox (expires_at);
CREATE INDEX outbox_inbox_recent_idx ON outbox_inbox (inbox, recorded_at);

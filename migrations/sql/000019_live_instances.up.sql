-- Consumer group instances whose client proves it is alive: the client's
-- LISTEN session holds the session advisory lock (1885826914, lock_key)
-- for as long as it lives. When that session ends (the process died, its
-- host vanished, its connection was cut), any client finds the lock free
-- and takes the instance's leases back at once instead of waiting for
-- them to run out. An instance without a row keeps the lease alone.
CREATE TABLE outbox_live_instances (
    member        text        PRIMARY KEY,
    lock_key      integer     NOT NULL CHECK (lock_key > 0),
    registered_at timestamptz NOT NULL DEFAULT now()
);

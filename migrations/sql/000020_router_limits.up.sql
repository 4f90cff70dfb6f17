-- Router pools whose limits hold across every router of a name (see
-- router.SharedLimits): one row per router name and pool, holding the
-- pool's rate-limit token bucket (tokens, refilled from refilled_at at
-- the pool's rate), and one row per router instance holding concurrency
-- permits of a pool, under a lease the instance renews, with how many it
-- wants (the pool's permits are shared out fairly among the instances
-- that want some). Permits whose lease ran out (the instance died, or was
-- cut off) are free again.
CREATE TABLE outbox_router_limits (
    router      text             NOT NULL,
    pool        text             NOT NULL,
    tokens      double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz      NOT NULL DEFAULT clock_timestamp(),
    last_grant  integer          NOT NULL DEFAULT 0,
    PRIMARY KEY (router, pool)
);

CREATE TABLE outbox_router_permits (
    router      text        NOT NULL,
    pool        text        NOT NULL,
    instance    text        NOT NULL,
    permits     integer     NOT NULL CHECK (permits >= 0),
    wanted      integer     NOT NULL DEFAULT 0,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (router, pool, instance)
);

-- The router instance that leads each name, for operators (see
-- pgoutbox.Standby): written by the leader as it starts leading.
CREATE TABLE outbox_router_leaders (
    router   text        PRIMARY KEY,
    instance text        NOT NULL,
    since    timestamptz NOT NULL DEFAULT now()
);

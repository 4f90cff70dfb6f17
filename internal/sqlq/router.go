package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Router is the SQL of the limits routers share (router.SharedLimits) and
// of their leaders.
type Router struct {
	// EnsurePool makes the row of pool @pool of router @router;
	// LockPool locks it, so that permits are granted one instance at a
	// time.
	EnsurePool, LockPool string
	// Permits sets instance @instance's permits of the pool (see
	// routerPermits) under a lease of @lease_ms, and returns them and the
	// lease's end in milliseconds from now. Run it after LockPool, in its
	// transaction: it reads the others' permits afresh.
	Permits string
	// Tokens takes up to @want tokens of the pool's bucket, which fills
	// at @per_second up to @burst, and returns how many it took.
	Tokens string
	// ReleasePermits drops an instance's permits; Holders lists the
	// instances holding unexpired permits of every router's pools, and
	// Leaders the instance that leads each router name (as the leader
	// wrote it); SetLeader records @instance as @router's leader.
	ReleasePermits, Holders, Leaders, SetLeader string
}

// ForRouter returns the statements for schema (already validated).
func ForRouter(schema string) *Router {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Router{
		EnsurePool:     r.Replace(ensureRouterPool),
		LockPool:       r.Replace(lockRouterPool),
		Permits:        r.Replace(routerPermits),
		Tokens:         r.Replace(routerTokens),
		ReleasePermits: r.Replace(releaseRouterPermits),
		Holders:        r.Replace(routerHolders),
		Leaders:        r.Replace(routerLeaders),
		SetLeader:      r.Replace(setRouterLeader),
	}
}

const ensureRouterPool = `
INSERT INTO {{schema}}.outbox_router_limits (router, pool) VALUES (@router, @pool)
ON CONFLICT (router, pool) DO NOTHING`

const lockRouterPool = `
SELECT 1 FROM {{schema}}.outbox_router_limits WHERE router = @router AND pool = @pool FOR UPDATE`

// routerPermits reads the other instances' permits in a snapshot taken
// after LockPool's lock: every grant committed before it is counted. An
// instance gets what it wants (@want), at most what the others leave of
// @limit, and at most its fair share among the instances that want
// permits; never less than it has in use (@in_use), which it was granted
// before.
const routerPermits = `
INSERT INTO {{schema}}.outbox_router_permits AS p (router, pool, instance, permits, wanted, lease_until)
SELECT @router, @pool, @instance,
       greatest(@in_use::integer, least(@want::integer, greatest(@limit::integer - o.held, 0),
                ceil(@limit::float8 / (o.wanting + 1))::integer)),
       @want::integer, clock_timestamp() + @lease_ms * interval '1 millisecond'
FROM (SELECT coalesce(sum(permits), 0)::integer AS held, count(*) FILTER (WHERE wanted > 0)::integer AS wanting
      FROM {{schema}}.outbox_router_permits
      WHERE router = @router AND pool = @pool AND instance <> @instance AND lease_until > clock_timestamp()) AS o
ON CONFLICT (router, pool, instance) DO UPDATE
SET permits = EXCLUDED.permits, wanted = EXCLUDED.wanted, lease_until = EXCLUDED.lease_until
RETURNING p.permits, extract(epoch FROM p.lease_until - clock_timestamp())::float8 * 1000`

// routerTokens refills the bucket for the time since its last refill and
// takes what it grants, in one update of the row: a concurrent take waits
// for this one and works on its result.
const routerTokens = `
UPDATE {{schema}}.outbox_router_limits
SET last_grant = floor(least(@want::float8, least(@burst::float8,
        tokens + extract(epoch FROM clock_timestamp() - refilled_at) * @per_second::float8)))::integer,
    tokens = least(@burst::float8, tokens + extract(epoch FROM clock_timestamp() - refilled_at) * @per_second::float8)
             - floor(least(@want::float8, least(@burst::float8,
                 tokens + extract(epoch FROM clock_timestamp() - refilled_at) * @per_second::float8))),
    refilled_at = clock_timestamp()
WHERE router = @router AND pool = @pool
RETURNING last_grant`

const releaseRouterPermits = `
DELETE FROM {{schema}}.outbox_router_permits WHERE router = @router AND instance = @instance`

const routerHolders = `
SELECT router, pool, instance, permits, wanted, extract(epoch FROM lease_until - clock_timestamp())::float8
FROM {{schema}}.outbox_router_permits
WHERE lease_until > clock_timestamp()
ORDER BY router, pool, instance`

const routerLeaders = `
SELECT router, instance, since FROM {{schema}}.outbox_router_leaders ORDER BY router`

const setRouterLeader = `
INSERT INTO {{schema}}.outbox_router_leaders (router, instance) VALUES (@router, @instance)
ON CONFLICT (router) DO UPDATE SET instance = EXCLUDED.instance, since = now()`

package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// RouterCluster is what the routers of one name share, as the database
// holds it: which instance leads (routers on standby), and which holds
// which permits of each pool (routers with shared limits).
type RouterCluster struct {
	Name string `json:"name"`
	// Leader is the instance that leads, as it wrote when it began to
	// (nil when none of this name runs on standby).
	Leader *RouterLeader `json:"leader,omitempty"`
	// Permits are the unexpired permits each instance holds, by pool.
	Permits []RouterPermits `json:"permits"`
}

// RouterLeader is the instance that leads a router name, since when.
type RouterLeader struct {
	Instance string    `json:"instance"`
	Since    time.Time `json:"since"`
}

// RouterPermits are the concurrency permits of a pool one instance holds,
// how many it wants, and how long its lease has left.
type RouterPermits struct {
	Pool      string        `json:"pool"`
	Instance  string        `json:"instance"`
	Permits   int           `json:"permits"`
	Wanted    int           `json:"wanted"`
	LeaseLeft time.Duration `json:"-"`
}

// MarshalJSON writes LeaseLeft in seconds.
func (p RouterPermits) MarshalJSON() ([]byte, error) {
	type plain RouterPermits
	return json.Marshal(struct {
		plain
		LeaseLeft float64 `json:"lease_left_seconds"`
	}{plain(p), p.LeaseLeft.Seconds()})
}

// Routers reads, for each router name, its leader and the permits its
// instances hold (two small reads).
func (a *Admin) Routers(ctx context.Context) ([]RouterCluster, error) {
	q := a.rq
	byName := map[string]*RouterCluster{}
	var names []string
	cluster := func(name string) *RouterCluster {
		c, ok := byName[name]
		if !ok {
			c = &RouterCluster{Name: name, Permits: []RouterPermits{}}
			byName[name] = c
			names = append(names, name)
		}
		return c
	}
	rows, err := a.pool.Query(ctx, q.Leaders)
	if err != nil {
		return nil, fmt.Errorf("admin: router leaders: %w", err)
	}
	var name string
	var l RouterLeader
	if _, err := pgx.ForEachRow(rows, []any{&name, &l.Instance, &l.Since}, func() error {
		leader := l
		cluster(name).Leader = &leader
		return nil
	}); err != nil {
		return nil, fmt.Errorf("admin: router leaders: %w", err)
	}
	rows, err = a.pool.Query(ctx, q.Holders)
	if err != nil {
		return nil, fmt.Errorf("admin: router permits: %w", err)
	}
	var p RouterPermits
	var left float64
	if _, err := pgx.ForEachRow(rows, []any{&name, &p.Pool, &p.Instance, &p.Permits, &p.Wanted, &left}, func() error {
		p.LeaseLeft = time.Duration(left * float64(time.Second))
		c := cluster(name)
		c.Permits = append(c.Permits, p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("admin: router permits: %w", err)
	}
	slices.Sort(names)
	out := make([]RouterCluster, 0, len(names))
	for _, n := range names {
		out = append(out, *byName[n])
	}
	return out, nil
}

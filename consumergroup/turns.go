package consumergroup

import (
	"context"
	"sync"
)

// turn keeps the order in which the fetcher handed batches to the batch
// handler: a batch's turn comes once the batch before it has had its
// turn (see InTurn) or its handler returned.
type turn struct {
	ready    <-chan struct{} // closed once the batch before has had its turn
	finished chan struct{}   // closed once this batch has had its turn
	once     sync.Once
}

func (t *turn) finish() { t.once.Do(func() { close(t.finished) }) }

type turnKey struct{}

// nextTurn makes the turn of the batch the fetcher hands out next (the
// fetcher's goroutine only).
func (r *runner) nextTurn() *turn {
	if r.lastTurn == nil {
		first := make(chan struct{})
		close(first)
		r.lastTurn = first
	}
	t := &turn{ready: r.lastTurn, finished: make(chan struct{})}
	r.lastTurn = t.finished
	return t
}

// InTurn runs f, within a BatchHandler, once the batch handlers of every
// batch the group fetched before this one have run theirs (or returned):
// a handler that passes batches on, as the router's GroupSource does,
// passes them on in the order they were fetched, although batch handlers
// run concurrently. Outside a batch handler's ctx, or once ctx ends, f
// runs at once.
func InTurn(ctx context.Context, f func()) {
	t, ok := ctx.Value(turnKey{}).(*turn)
	if !ok {
		f()
		return
	}
	defer t.finish()
	select {
	case <-t.ready:
	case <-ctx.Done():
	}
	f()
}

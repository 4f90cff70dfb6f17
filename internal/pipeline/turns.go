package pipeline

import (
	"context"
	"sync"
)

// turn keeps the order in which batches were handed to the batch
// handler: a batch's turn comes once the batch before it has had its turn
// (see InTurn) or its handler returned.
type turn struct {
	ready    <-chan struct{} // closed once the batch before has had its turn
	finished chan struct{}   // closed once this batch has had its turn
	once     sync.Once
}

func (t *turn) finish() { t.once.Do(func() { close(t.finished) }) }

type turnKey struct{}

// turns hands out the turns of successive batches (one goroutine only).
type turns struct {
	last chan struct{} // closed once the last batch handed out had its turn
}

func (ts *turns) next() *turn {
	if ts.last == nil {
		first := make(chan struct{})
		close(first)
		ts.last = first
	}
	t := &turn{ready: ts.last, finished: make(chan struct{})}
	ts.last = t.finished
	return t
}

// InTurn runs f, within a batch handler, once the batch handlers of every
// batch dispatched before this one have run theirs (or returned). Outside
// a batch handler's ctx, or once ctx ends, f runs at once.
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

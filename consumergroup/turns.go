package consumergroup

import (
	"context"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// InTurn runs f, within a BatchHandler, once the batch handlers of every
// batch the group fetched before this one have run theirs (or returned):
// a handler that passes batches on, as the router's GroupSource does,
// passes them on in the order they were fetched, although batch handlers
// run concurrently. Outside a batch handler's ctx, or once ctx ends, f
// runs at once.
func InTurn(ctx context.Context, f func()) { pipeline.InTurn(ctx, f) }

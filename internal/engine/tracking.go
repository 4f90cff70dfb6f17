package engine

import (
	"time"

	"github.com/pgoutbox/pgoutbox/internal/completion"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Stream holds the bind values of sqlq's stream filter: which rows of a
// snapshot pair belong to the group.
type Stream struct {
	Bit    int64      // Bitmap: rows requiring the group's bit
	SubID  *int64     // Counter: rows requiring it; Bitmap and Counter: rows it recorded finishing
	All    bool       // every row (offset mode, or a start from the beginning)
	From   *time.Time // rows written from this time
	FromID *int64     // rows from this id
}

// Bind sets args' stream_* arguments (see sqlq's streamFilter) and
// returns args.
func (s Stream) Bind(args sqlq.Args) sqlq.Args {
	args["stream_bit"], args["stream_sub"], args["stream_all"] = s.Bit, s.SubID, s.All
	args["stream_from"], args["stream_from_id"] = s.From, s.FromID
	return args
}

// BindDone sets args' done_* arguments (see sqlq's notCompleted): what
// the stream reads by, the group's bit and subscription, is what its
// completions are recorded by.
func (s Stream) BindDone(args sqlq.Args) sqlq.Args {
	args["done_bit"], args["done_sub"] = s.Bit, s.SubID
	return args
}

// CatchupRange says which rows of a backfill's pair the group reads: for
// a group that started now (and came back from DEAD), every row; else the
// rows its start position selects.
type CatchupRange struct {
	All    bool
	From   *time.Time
	FromID *int64
}

// Bind sets args' catchup_* arguments (see sqlq's catchupRows) and
// returns args.
func (c CatchupRange) Bind(args sqlq.Args) sqlq.Args {
	args["catchup_all"], args["catchup_from"], args["catchup_from_id"] = c.All, c.From, c.FromID
	return args
}

// Tracking is how an instance reads and records its group's messages. A
// change of the topic's tracking mode changes it (and may give the group
// a bit): each look reads it again (see FetchConfig.SetTracking), before
// it reads messages, so a batch is always completed by a tracker that
// knows how its messages are tracked.
type Tracking struct {
	Sub     completion.Subscription
	Stream  Stream
	Tracker completion.Tracker
	Mode    outbox.TrackingMode
	Mixing  bool
}

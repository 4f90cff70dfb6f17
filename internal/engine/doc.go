// Package engine holds the database side of a consumer group instance's
// pipeline, where package pipeline holds its rules without a database.
// Every delivery path runs on it: QUEUE consumers, consumer groups, the
// router's sources and the relay (package consumergroup makes and runs
// an [Instance] for each).
//
// It holds the fetch step ([Fetcher]: looks for work, takes over
// expired leases, claims retries, reads the stream and a backfill, and
// walks an ordered group's message groups), the complete step's writes
// ([Instance.Write]) and the lease keeper ([Instance.KeepLeases]). A look
// runs in one transaction ([LookTx]) on a connection ready for it
// ([LookConns]). Package consumergroup owns the subscription's lifecycle
// (registration, heartbeats, state changes) and tells the engine how the
// group tracks its messages ([Tracking]).
package engine

// Package engine holds the database side of a consumer group instance's
// pipeline, where package pipeline holds its rules without a database.
// Every delivery path runs on it: QUEUE consumers, consumer groups, the
// router's sources and the relay (package consumergroup makes and runs
// an [Instance] for each).
//
// So far it holds the complete step's writes ([Instance.Write]), the
// lease keeper ([Instance.KeepLeases]), and a look's transaction
// ([LookTx]) on a connection ready for it ([LookConns]); what a look
// reads and claims is still in package consumergroup.
package engine

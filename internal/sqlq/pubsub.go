package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// PubSub is the SQL of consumer groups on PUB_SUB topics.
//
// Snapshots (pg_snapshot) and transaction ids (xid8) travel as text.
//
// Locks are always taken in one order, so lifecycle changes never
// deadlock: a subscription row, then its offsets row, then the topic row.
// Producers take the topic row FOR KEY SHARE (see insertPublished), so a
// change of the subscribed set waits for the producer transactions that
// read the old set and holds back those that would read it next.
type PubSub struct {
	// Subscriptions and their state.
	LockTopic, LockTopicShared                                     string
	SelectSubscription, InsertSubscription, InsertOffset           string
	QueueOnLog                                                     string
	SubscribedBits, AddSubscribed, RemoveSubscribed, SetStatus     string
	LockOffsetWait, ResurrectOffset, SubscriptionStatus, Heartbeat string
	DeadCandidates, AnyDeadCandidate, LockOffsetsSkipLocked        string
	PendingForgets, LockForget, ForgetDone, DeleteGroupState       string
	CommittedPosition, DeletedTombstone                            string

	// Fetching.
	CancelBackfill, BackfillState       string
	DeleteOrphanRetries, AnalyzeRetries string
	DeadLettersToComplete               string
	// Run by every look, or for most batches or messages: numbered once
	// (see Named).
	LockOffset, OffsetExists, FetchState          Named
	FetchRows, FetchRowsAhead, TakeAhead, AnyWork Named
	CatchupRows, CatchupSize, MoveBatchToRetries  Named
	ClaimRetries, ClaimOrderedRetries             Named
	TakeExpiredBatch, AdvanceOffset, InsertBatch  Named
	SetAside, ForgetSetAside                      Named
	ReapRetries, CopyDeadLetters, ParkRows        Named
	CatchupProgress, NextBackfillPair             Named
	FinishBackfill                                Named

	// Completing (every statement numbered once, see Named).
	FinishBatch, InsertRetries, SettleRetry, DeleteRetries, ExtendLeases Named
	HoldBatch, TakeRetry, RecordHandled, ForgetHandled                   Named

	// Administration.
	ListDeadLetters, ReplayDeadLetters, DiscardDeadLetters    string
	BlockedMessageGroups, BlockedGroupsSummary                string
	GroupHealthHead                                           string
	GroupHealth                                               Named
	ResurrectFromNow, ForceCompleteRetries, ForceCompleteRows string
	ForceTarget, ForceAdvance                                 string
	Inconsistencies                                           string

	CompleteRecords, CompleteTracked                              Named // a batch's completion
	BitmapForget, BitmapStrip, BitmapCleanup                      string
	CounterForgetCandidates                                       string
	CounterForget, CounterCleanup, OffsetCleanup, UpsertWatermark string
	CounterStrip                                                  string
	BitmapHeld, CounterHeld, OffsetHeld                           string
	MixedHeld, MixedCleanup, ModeChangeOver                       string
	RetentionFrontier, SnapshotXmax                               string
}

// ForPubSub returns the statements for schema (already validated).
func ForPubSub(schema string) *PubSub {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	q := func(s string) string { return r.Replace(s) }
	return &PubSub{
		LockTopic:             q(lockTopic),
		LockTopicShared:       q(lockTopicShared),
		DeletedTombstone:      q(deletedTombstone),
		CopyDeadLetters:       named(q(copyDeadLetters)),
		DeadLettersToComplete: q(deadLettersToComplete),
		SelectSubscription:    q(selectSubscription),
		InsertSubscription:    q(insertSubscription),
		QueueOnLog:            q(queueOnLog),
		InsertOffset:          q(insertOffset),
		SubscribedBits:        q(subscribedBits),
		AddSubscribed:         q(addSubscribed),
		RemoveSubscribed:      q(removeSubscribed),
		SetStatus:             q(setStatus),
		LockOffsetWait:        q(lockOffsetWait),
		ResurrectOffset:       q(resurrectOffset),
		SubscriptionStatus:    q(subscriptionStatus),
		Heartbeat:             q(heartbeat),
		DeadCandidates:        q(deadCandidates),
		AnyDeadCandidate:      q(anyDeadCandidate),
		LockOffsetsSkipLocked: q(lockOffsetsSkipLocked),
		PendingForgets:        q(pendingForgets),
		LockForget:            q(lockForget),
		ForgetDone:            q(forgetDone),
		DeleteGroupState:      q(deleteGroupState),
		CommittedPosition:     q(committedPosition),

		LockOffset:          named(q(lockOffset)),
		OffsetExists:        named(q(offsetExists)),
		FetchState:          named(q(fetchState)),
		CatchupRows:         named(q(catchupRows)),
		CatchupSize:         named(q(catchupSize)),
		CatchupProgress:     named(q(catchupProgress)),
		FinishBackfill:      named(q(finishBackfill)),
		CancelBackfill:      q(cancelBackfill),
		BackfillState:       q(backfillState),
		NextBackfillPair:    named(q(nextBackfillPair)),
		TakeExpiredBatch:    named(q(takeExpiredBatch)),
		MoveBatchToRetries:  named(q(moveBatchToRetries)),
		FetchRows:           named(q(fetchRows)),
		FetchRowsAhead:      named(q(fetchRowsAhead)),
		TakeAhead:           named(q(takeAhead)),
		SetAside:            named(q(setAside)),
		ForgetSetAside:      named(q(forgetSetAside)),
		AnyWork:             named(q(anyWork)),
		AdvanceOffset:       named(q(advanceOffset)),
		InsertBatch:         named(q(insertBatch)),
		ReapRetries:         named(q(reapRetries)),
		AnalyzeRetries:      q(analyzeRetries),
		DeleteOrphanRetries: q(deleteOrphanRetries),
		ClaimRetries:        named(q(claimRetries)),
		ParkRows:            named(q(parkRows)),
		ClaimOrderedRetries: named(q(claimOrderedRetries)),

		FinishBatch:   named(q(finishBatch)),
		InsertRetries: named(q(insertRetries)),
		SettleRetry:   named(q(settleRetry)),
		DeleteRetries: named(q(deleteRetries)),
		ExtendLeases:  named(q(extendGroupLeases)),
		HoldBatch:     named(q(holdBatch)),
		TakeRetry:     named(q(takeRetry)),
		RecordHandled: named(q(recordHandled)),
		ForgetHandled: named(q(forgetHandled)),

		ListDeadLetters:      q(listGroupDeadLetters),
		ReplayDeadLetters:    q(replayGroupDeadLetters),
		DiscardDeadLetters:   q(discardGroupDeadLetters),
		BlockedMessageGroups: q(blockedMessageGroups),
		BlockedGroupsSummary: q(blockedGroupsSummary),
		GroupHealthHead:      q(groupHealthHead),
		GroupHealth:          named(q(groupHealth)),
		ResurrectFromNow:     q(resurrectFromNow),
		ForceCompleteRetries: q(forceCompleteRetries),
		ForceCompleteRows:    q(forceCompleteRows),
		ForceTarget:          q(forceTarget),
		ForceAdvance:         q(forceAdvance),
		Inconsistencies:      q(inconsistencies),

		CompleteRecords:         named(q(completeRecords)),
		CompleteTracked:         named(q(completeTracked)),
		BitmapForget:            q(bitmapForget),
		BitmapStrip:             q(bitmapStrip),
		BitmapCleanup:           q(bitmapCleanup),
		CounterForgetCandidates: q(counterForgetCandidates),
		CounterForget:           q(counterForget),
		CounterStrip:            q(counterStrip),
		CounterCleanup:          q(counterCleanup),
		OffsetCleanup:           q(offsetCleanup),
		BitmapHeld:              q(partitionHeld(unfinishedInRange(bitmapDone("o", "positions")))),
		CounterHeld:             q(partitionHeld(unfinishedInRange(counterDone("o", "positions")))),
		OffsetHeld:              q(partitionHeld(beforeWatermark)),
		MixedHeld:               q(partitionHeld(unfinishedInRange(mixedDone("@watermark")))),
		MixedCleanup:            q(mixedCleanup),
		ModeChangeOver:          q(modeChangeOver),
		UpsertWatermark:         q(upsertWatermark),
		RetentionFrontier:       q(retentionFrontier),
		SnapshotXmax:            q(snapshotXmax),
	}
}

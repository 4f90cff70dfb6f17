package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/natstest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/natsrelay"
)

// send sends one message of group with seq and a payload padded to size
// bytes (at least), and headers.
func (e *env) send(t *testing.T, group string, s, size int, headers map[string]string) int64 {
	t.Helper()
	p, _ := json.Marshal(struct {
		seq
		Pad string `json:"pad,omitempty"`
	}{seq{Group: group, Seq: s}, strings.Repeat("x", max(0, size-40))})
	id, err := e.producer.Send(context.Background(), e.db.Pool, outbox.Message{Topic: e.topic, Group: group, Payload: p, Headers: headers})
	require.NoError(t, err)
	return id
}

func deadLetters(t *testing.T, r *relay.Relay) map[int64]string {
	t.Helper()
	dls, err := r.Group().DeadLetters(context.Background(), 0, 100)
	require.NoError(t, err)
	out := map[int64]string{}
	for _, d := range dls {
		out[d.ID] = d.LastError
	}
	return out
}

// A message JetStream refuses for itself (bigger than the stream's
// MaxMsgSize, or than the server's max_payload) and one whose subject is
// not valid are dead-lettered at once, with the reason; their message
// group waits behind them (the topic's BlockGroup policy) and the other
// groups go on.
func TestRejectedMessagesAreDeadLetteredWithTheReason(t *testing.T) {
	stream := *eventsStream
	stream.MaxMsgSize = 2048
	e := newEnvOn(t, orderedTopic, &stream, natstest.Options{Config: "max_payload: 8192"})
	r := e.startRelay(t, relay.Config{Subject: "events.{message_group}.{header.region}"})
	e.send(t, "big", 0, 10, nil)
	tooBigForStream := e.send(t, "big", 1, 4000, nil)
	e.send(t, "big", 2, 10, nil)
	tooBigForServer := e.send(t, "huge", 0, 20000, nil)
	badSubject := e.send(t, "bad", 0, 10, map[string]string{"region": "eu west"})
	// Longer than a NATS server's protocol line: it would close the
	// connection for every message group.
	longSubject := e.send(t, "long", 0, 10, map[string]string{"region": strings.Repeat("a", 5000)})
	for s := range 3 {
		e.send(t, "fine", s, 10, map[string]string{"region": "eu"})
	}
	pgtest.Eventually(t, 30*time.Second, "four dead letters", func() bool { return len(deadLetters(t, r)) == 4 })
	pgtest.Eventually(t, 30*time.Second, "the other groups relayed", func() bool { return e.streamCount(t) == 4 })
	dead := deadLetters(t, r)
	require.Contains(t, dead[tooBigForStream], "rejected by the broker")
	require.Contains(t, dead[tooBigForStream], "message size exceeds maximum")
	require.Contains(t, dead[tooBigForServer], "maximum payload exceeded")
	require.Contains(t, dead[badSubject], "invalid subject")
	require.Contains(t, dead[longSubject], "invalid subject")
	var subjects []string
	for _, m := range e.readStream(t) {
		subjects = append(subjects, m.subject+"#"+string(rune('0'+m.seq.Seq)))
	}
	require.ElementsMatch(t, []string{"events.big._#0", "events.fine.eu#0", "events.fine.eu#1", "events.fine.eu#2"}, subjects,
		"big's seq 2 waits behind its dead letter")
}

// No stream captures the subject: a configuration fault. The relay
// retries with backoff, logs an error and counts it, dead-letters
// nothing, and publishes everything in order once the stream exists.
func TestMissingStreamIsRetriedNotDeadLettered(t *testing.T) {
	e := newEnv(t, orderedTopic, nil)
	logs := &testlog.Buffer{}
	reader := sdkmetric.NewManualReader()
	r := e.startRelay(t, relay.Config{Consumer: consumergroup.Config{Logger: logs.Logger(),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}})
	e.sendGroups(t, 4, 5, 20, 0, nil)
	pgtest.Eventually(t, 30*time.Second, "an error logged", func() bool {
		return len(logs.Lines("level=ERROR", "destination is missing or not permitted", "no stream captures subject")) > 0
	})
	time.Sleep(2 * time.Second) // several rounds of retries
	require.Empty(t, deadLetters(t, r))
	points := testmetrics.Points(t, reader)
	failed, ok := testmetrics.Point(points, "pgoutbox.relay.failures", "reason", "misconfigured")
	require.True(t, ok)
	require.GreaterOrEqual(t, failed.Value, 8.0, "retried: each round counts its messages")
	lag, ok := testmetrics.Point(points, "pgoutbox.relay.unrelayed")
	require.True(t, ok)
	require.Equal(t, 20.0, lag.Value, "unrelayed messages")

	e.ensureStream(t, *eventsStream)
	pgtest.Eventually(t, 30*time.Second, "relayed once the stream exists", func() bool { return drained(t, r) })
	checkStream(t, e.readStream(t), 4, 5)
	points = testmetrics.Points(t, reader)
	published, _ := testmetrics.Point(points, "pgoutbox.relay.published")
	require.Equal(t, 20.0, published.Value)
	latency, _ := testmetrics.Point(points, "pgoutbox.relay.latency")
	require.Equal(t, 20.0, latency.Value, "a latency recorded per message")
	lag, _ = testmetrics.Point(points, "pgoutbox.relay.unrelayed")
	require.Zero(t, lag.Value)
	require.Empty(t, deadLetters(t, r))
}

// The relay's user may not publish to the subject: the server refuses
// each publish, which then times out. That is a configuration fault too.
func TestPermissionViolationIsMisconfigured(t *testing.T) {
	conf := `authorization {
  users: [
    {user: admin, password: admin}
    {user: relay, password: relay, permissions: {publish: {allow: ["$JS.API.>", "_INBOX.>", "events.allowed.>"]}, subscribe: {allow: [">"]}}}
  ]
}`
	e := newEnvOn(t, orderedTopic, eventsStream, natstest.Options{Config: conf}, natsrelay.NATSConfig{User: "admin", Password: "admin"})
	logs := &testlog.Buffer{}
	nc, err := natsrelay.Connect(natsrelay.NATSConfig{URL: e.nats.URL(), User: "relay", Password: "relay", Logger: logs.Logger()})
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	pub := e.publisher(t, natsrelay.JetStreamConfig{Conn: nc, AckTimeout: 500 * time.Millisecond})
	r := e.startRelay(t, relay.Config{Publisher: pub, Subject: "events.denied.{message_group}",
		Consumer: consumergroup.Config{Logger: logs.Logger()}})
	e.sendGroups(t, 2, 3, 6, 0, nil)
	pgtest.Eventually(t, 30*time.Second, "an error logged", func() bool {
		return len(logs.Lines("level=ERROR", "destination is missing or not permitted", "ermissions")) > 0
	})
	require.Empty(t, deadLetters(t, r))
	require.Zero(t, e.streamCount(t))
}

// While the NATS server is down nothing is acked: the messages wait,
// without spending attempts towards dead letters, and go once it is back.
func TestNothingAckedWhileTheServerIsDown(t *testing.T) {
	tc := orderedTopic
	tc.MaxAttempts = 2 // a relay that spent attempts would dead-letter
	e := newEnv(t, tc, eventsStream)
	r := e.startRelay(t, relay.Config{})
	e.sendGroups(t, 3, 2, 6, 0, nil)
	pgtest.Eventually(t, 30*time.Second, "the first messages relayed", func() bool { return drained(t, r) })
	e.nats.Kill()
	e.sendGroups(t, 3, 10, 10, 0, nil) // seq 0..9 again: the order check below starts at the second round
	time.Sleep(7 * time.Second)        // past the handler's timeout (the topic's 3 s lease), twice
	h, err := r.Group().Health(context.Background(), 1000)
	require.NoError(t, err)
	require.EqualValues(t, 30, h.Unread+h.Queued+h.Waiting+h.LeasedRetries, "nothing acked while the server is down")
	require.Empty(t, deadLetters(t, r))
	e.nats.Restart()
	pgtest.Eventually(t, time.Minute, "relayed once the server is back", func() bool { return drained(t, r) })
	got := e.readStream(t)
	require.Len(t, got, 36)
	checkStream(t, got[6:], 3, 10)
	require.Empty(t, deadLetters(t, r))
}

// A connection closed for good is a configuration fault: retried, and an
// error, never a dead letter.
func TestClosedConnectionIsMisconfigured(t *testing.T) {
	e := newEnv(t, orderedTopic, eventsStream)
	nc, _ := e.connect(t)
	pub := e.publisher(t, natsrelay.JetStreamConfig{Conn: nc})
	nc.Close()
	errs := pub.Publish(context.Background(), []relay.Message{{ID: 1, DedupID: "events:1", Subject: "events.a", Payload: []byte("{}")}})
	require.ErrorIs(t, errs[0], relay.ErrMisconfigured)
}

// A topic that is not ordered needs AllowUnordered.
func TestUnorderedTopicNeedsAllowUnordered(t *testing.T) {
	e := newEnv(t, outbox.TopicConfig{Tracking: outbox.Offset}, eventsStream)
	pub := e.publisher(t, natsrelay.JetStreamConfig{})
	r, err := relay.New(e.db.Pool, relay.Config{Consumer: consumergroup.Config{Topic: e.topic, Schema: e.db.Schema}, Publisher: pub})
	require.NoError(t, err)
	require.ErrorIs(t, r.Start(context.Background(), consumergroup.FromNow()), relay.ErrUnorderedTopic)
	r, err = relay.New(e.db.Pool, relay.Config{Consumer: consumergroup.Config{Topic: e.topic, Schema: e.db.Schema}, Publisher: pub,
		Subject: "events.{message_group}", AllowUnordered: true})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background(), consumergroup.FromNow()))
	e.sendGroups(t, 1, 5, 5, 0, nil)
	pgtest.Eventually(t, 30*time.Second, "relayed", func() bool { return drained(t, r) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(ctx))
	require.Equal(t, 5, e.streamCount(t))
}

func TestNewRefusals(t *testing.T) {
	db := pgtest.NewDB(t)
	pub := relay.PublisherFunc(func(context.Context, []relay.Message) []error { return nil })
	for name, cfg := range map[string]relay.Config{
		"no publisher":       {Consumer: consumergroup.Config{Topic: "t"}},
		"bad placeholder":    {Consumer: consumergroup.Config{Topic: "t"}, Publisher: pub, Subject: "a.{nope}"},
		"unclosed":           {Consumer: consumergroup.Config{Topic: "t"}, Publisher: pub, Subject: "a.{topic"},
		"wildcard":           {Consumer: consumergroup.Config{Topic: "t"}, Publisher: pub, Subject: "a.*.{topic}"},
		"empty token":        {Consumer: consumergroup.Config{Topic: "t"}, Publisher: pub, Subject: "a..{topic}"},
		"negative retry":     {Consumer: consumergroup.Config{Topic: "t"}, Publisher: pub, RetryInitial: -1},
		"handler timeout":    {Consumer: consumergroup.Config{Topic: "t", HandlerTimeout: 500 * time.Millisecond}, Publisher: pub},
		"no topic (a group)": {Publisher: pub},
	} {
		_, err := relay.New(db.Pool, cfg)
		require.Error(t, err, name)
		if name != "no topic (a group)" {
			require.ErrorIs(t, err, outbox.ErrInvalidConfig, name) // one sentinel for every package
		}
	}
	_, err := relay.New(db.Pool, relay.Config{Consumer: consumergroup.Config{Topic: "t"}, Publisher: pub, Subject: "a.{nope}"})
	require.ErrorIs(t, err, relay.ErrInvalidSubject)
	_, err = relay.New(db.Pool, relay.Config{Consumer: consumergroup.Config{Topic: "t"}})
	require.ErrorIs(t, err, relay.ErrInvalidConfig)
	_, err = natsrelay.NewJetStreamPublisher(natsrelay.JetStreamConfig{})
	require.ErrorIs(t, err, relay.ErrInvalidConfig)
	_, err = natsrelay.Connect(natsrelay.NATSConfig{Token: "t", User: "u"})
	require.ErrorIs(t, err, relay.ErrInvalidConfig)
}

// EnsureStream gives a stream the relay's duplicate window unless one is
// set, and updates an existing stream.
func TestEnsureStreamSetsTheDuplicateWindow(t *testing.T) {
	e := newEnv(t, orderedTopic, nil)
	ctx := context.Background()
	s, err := natsrelay.EnsureStream(ctx, e.js, jetstream.StreamConfig{Name: "A", Subjects: []string{"a.>"}})
	require.NoError(t, err)
	require.Equal(t, natsrelay.DefaultDuplicateWindow, s.CachedInfo().Config.Duplicates)
	s, err = natsrelay.EnsureStream(ctx, e.js, jetstream.StreamConfig{Name: "A", Subjects: []string{"a.>"}, Duplicates: time.Hour})
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, time.Hour, info.Config.Duplicates)
}

package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/cmd/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/blockedtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/queuetest"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type result struct {
	code           int
	stdout, stderr string
}

// run runs the command in-process with DATABASE_URL set to dsn.
func run(t *testing.T, dsn string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return dsn
		}
		return ""
	}
	code := cli.Run(context.Background(), args, getenv, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// failsWith asserts a refusal: the exit status, and one line on stderr
// that says why.
func failsWith(t *testing.T, r result, code int, why string) {
	t.Helper()
	require.Equal(t, code, r.code, "exit status; stderr %q", r.stderr)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line on stderr: %q", r.stderr)
	require.Contains(t, r.stderr, why)
	require.Empty(t, r.stdout)
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	r := run(t, db.DSN, "migrate", "version", "--schema", "svc", "--json")
	require.Zero(t, r.code, r.stderr)
	var v struct{ Version, Latest uint }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Zero(t, v.Version, "nothing applied yet")

	r = run(t, db.DSN, "--schema=svc", "migrate", "up")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("schema svc at version %d", migrations.Latest()))
	require.NoError(t, migrations.Check(context.Background(), db.Pool, migrations.Config{Schema: "svc"}))

	failsWith(t, run(t, db.DSN, "migrate", "down", "--schema", "svc"), 2, "--yes")
	require.NoError(t, migrations.Check(context.Background(), db.Pool, migrations.Config{Schema: "svc"}), "down without --yes dropped nothing")
	r = run(t, db.DSN, "migrate", "down", "--schema", "svc", "--yes")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "schema svc at version 0")

	r = run(t, "", "migrate", "sql", "--schema", "svc", "--from", "11")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "000012_ordered_groups.up.sql")
	require.NotContains(t, r.stdout, "000011_ordered_topics.up.sql")

	failsWith(t, run(t, db.DSN, "migrate", "sideways"), 2, "usage: pgoutbox migrate")
	failsWith(t, run(t, db.DSN, "migrate", "up", "--schema", "Bad-Name"), 2, "schema")
	failsWith(t, run(t, "", "migrate", "up"), 2, "no database")
	failsWith(t, run(t, "postgres://127.0.0.1:1/x?connect_timeout=2", "topics"), 1, "connect")
}

// The operator's commands against a running setup: topics, groups with
// their health, pausing a group, and dead letters listed (payloads only
// when asked) and replayed; unknown names and malformed input are refused
// with their exit status and nothing changes.
func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue}))
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	dead := queuetest.DeadLetter(t, db.Pool, client, "bad payload", outbox.Message{Topic: "orders", Payload: json.RawMessage(`{"email":"someone@example.com"}`)})
	_, err = producer.Send(ctx, db.Pool, outbox.Message{Topic: "orders", Payload: json.RawMessage(`{"n":2}`)})
	require.NoError(t, err)
	g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: "events", Group: "billing", Client: client})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Stop(ctx)
	})
	schema := "--schema=" + db.Schema

	r := run(t, db.DSN, "topics", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	var topics []struct {
		Name        string
		Semantics   string
		Ready       *int64
		DeadLetters *int64 `json:"dead_letters"`
		Groups      []string
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &topics))
	require.Len(t, topics, 2)
	require.Equal(t, "events", topics[0].Name)
	require.Equal(t, []string{"billing"}, topics[0].Groups)
	require.Equal(t, "orders", topics[1].Name)
	require.EqualValues(t, 1, *topics[1].Ready)
	require.EqualValues(t, 1, *topics[1].DeadLetters)

	r = run(t, db.DSN, "stuck", schema, "--older-than", "0s", "--json")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, `"name": "orders"`, "its ready message has waited more than 0s")
	failsWith(t, run(t, db.DSN, "stuck", "--older-than", "soon", schema), 2, "older-than")

	r = run(t, db.DSN, "topics", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "TOPIC")
	require.Contains(t, r.stdout, "billing")

	r = run(t, db.DSN, "group", "pause", "events", "billing", schema)
	require.Zero(t, r.code, r.stderr)
	state, err := g.State(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.Paused, state)

	r = run(t, db.DSN, "groups", "events", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	var groups []struct {
		Group, State string
		Unread       int64
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &groups))
	require.Len(t, groups, 1)
	require.Equal(t, "billing", groups[0].Group)
	require.Equal(t, "PAUSED", groups[0].State)

	r = run(t, db.DSN, "dead", "list", "orders", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "bad payload")
	require.NotContains(t, r.stdout, "someone@example.com", "payloads only with --payloads")
	r = run(t, db.DSN, "dead", "list", "orders", schema, "--json", "--payloads")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "someone@example.com")

	failsWith(t, run(t, db.DSN, "groups", "nope", schema), 3, "not found")
	failsWith(t, run(t, db.DSN, "group", "resume", "events", "nobody", schema), 3, "nobody")
	failsWith(t, run(t, db.DSN, "dead", "replay", "orders", "99999", schema), 3, "not found")
	failsWith(t, run(t, db.DSN, "dead", "replay", "orders", "12x", "1", schema), 2, "QUEUE") // "12x" names a group, of a QUEUE topic
	failsWith(t, run(t, db.DSN, "dead", "replay", "orders", "billing", "x1", schema), 2, `"x1" is not a message id`)
	failsWith(t, run(t, db.DSN, "dead", "list", "events", "--group", "42", schema), 3, `"42"`) // a numeric group name, by --group
	failsWith(t, run(t, db.DSN, "group", "explode", "events", "billing", schema), 2, "usage")
	failsWith(t, run(t, db.DSN, "groups", "orders", schema), 2, "QUEUE")
	failsWith(t, run(t, db.DSN, "frobnicate"), 2, "unknown command")
	failsWith(t, run(t, db.DSN, "dead", "purge", "orders", schema), 2, "--all")
	failsWith(t, run(t, db.DSN, "dead", "purge", "orders", "1", "--all", schema), 2, "not both")
	failsWith(t, run(t, db.DSN, "dead", "list", "orders", "--limit", "0", schema), 2, "--limit")
	// Nothing changed: the dead letter is still there, the group still paused.
	adm, err := admin.New(client, admin.Options{})
	require.NoError(t, err)
	dls, err := adm.DeadLetters(ctx, "orders", "", 0, 10)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	state, err = g.State(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.Paused, state)

	r = run(t, db.DSN, "dead", "replay", "orders", fmt.Sprint(dead[0]), schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "replayed 1 dead letters")
	dls, err = adm.DeadLetters(ctx, "orders", "", 0, 10)
	require.NoError(t, err)
	require.Empty(t, dls)
}

// mode migrate, group resurrect and force-complete, and check, with
// their refusals.
func TestModeAndRepairCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue}))
	g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: "events", Group: "billing", Client: client})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	require.NoError(t, g.Pause(ctx))
	require.NoError(t, g.Stop(ctx))
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	ids, err := producer.SendBatch(ctx, db.Pool, []outbox.Message{{Topic: "events", Payload: json.RawMessage(`{}`)}, {Topic: "events", Payload: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	schema := "--schema=" + db.Schema

	r := run(t, db.DSN, "mode", "migrate", "events", "counter", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "COUNTER mode")
	topic, err := client.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.Counter, topic.Tracking)
	require.True(t, topic.ModeChanging, "two Bitmap messages are stored")
	r = run(t, db.DSN, "topics", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "COUNTER (changing)")
	failsWith(t, run(t, db.DSN, "mode", "migrate", "events", "sideways", schema), 2, `"sideways" is not a tracking mode`)
	failsWith(t, run(t, db.DSN, "mode", "migrate", "nope", "offset", schema), 3, "not found")
	failsWith(t, run(t, db.DSN, "mode", "migrate", "orders", "offset", schema), 2, "QUEUE")
	failsWith(t, run(t, db.DSN, "mode", "switch", "events", "offset", schema), 2, "usage")

	r = run(t, db.DSN, "check", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	require.Equal(t, "[]\n", r.stdout)

	failsWith(t, run(t, db.DSN, "group", "resurrect", "events", "billing", schema), 2, "only a DEAD group")
	failsWith(t, run(t, db.DSN, "group", "pause", "events", "billing", "--no-backfill", schema), 2, "--no-backfill")
	failsWith(t, run(t, db.DSN, "group", "force-complete", "events", "billing", schema), 2, "--older-than")
	failsWith(t, run(t, db.DSN, "group", "force-complete", "events", "nobody", "--older-than", "0s", schema), 3, "nobody")
	r = run(t, db.DSN, "group", "force-complete", "events", "billing", "--older-than", "0s", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	var forced struct{ Completed int64 }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &forced))
	require.EqualValues(t, 2, forced.Completed, "the paused group's two messages")

	_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("outbox_published")+` SET required_bits = 128 WHERE id = $1`, ids[0])
	require.NoError(t, err)
	r = run(t, db.DSN, "check", schema)
	require.Equal(t, 1, r.code, "inconsistencies found: %s", r.stderr)
	require.Contains(t, r.stdout, "GROUP")
	require.Contains(t, r.stderr, "does not add up")
}

// The installed binary's exit status and stderr, as a script sees them.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "pgoutbox")
	build := exec.Command("go", "build", "-o", bin, "github.com/pgoutbox/pgoutbox/cmd/pgoutbox")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	db := pgtest.NewDB(t)
	cmd := exec.Command(bin, "groups", "nope", "--schema", db.Schema)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.DSN)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 3, exit.ExitCode())
	require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one line on stderr: %q", stderr.String())
	require.Empty(t, stdout.String())

	out, err := exec.Command(bin, "help").Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "pgoutbox [flags] migrate up|down|version|sql")
}

// pgoutbox blocked lists the message groups ordered topics and groups are
// held back on (every one, a topic's or a group's), with the head, its
// attempts and last error, since when, and how many wait behind it; and
// groups shows an ordered group's queue apart from what waits for a
// retry.
func TestBlockedCommand(t *testing.T) {
	t.Parallel()
	f := blockedtest.New(t)
	db := f.DB
	schema := "--schema=" + db.Schema

	type row struct {
		Topic, Group string
		MessageGroup string `json:"message_group"`
		HeadID       int64  `json:"head_id"`
		Attempts     int
		LastError    string `json:"last_error"`
		Since        time.Time
		DeadLettered bool `json:"dead_lettered"`
		Behind       int
	}
	r := run(t, db.DSN, "blocked", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	var rows []row
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows))
	require.Len(t, rows, 4, r.stdout)
	where := map[string]row{}
	for _, r := range rows {
		require.False(t, r.Since.IsZero())
		where[r.Topic+"/"+r.Group+"/"+r.MessageGroup] = r
	}
	dead := where["orders//cust-99"]
	require.Equal(t, row{Topic: "orders", MessageGroup: "cust-99", HeadID: f.DeadHead, Attempts: 1,
		LastError: "permanent: " + blockedtest.QueueDeadError, Since: dead.Since, DeadLettered: true, Behind: 2}, dead)
	require.Equal(t, f.RetryHead, where["orders//cust-5"].HeadID)
	require.Equal(t, 1, where["orders//cust-5"].Behind)
	require.Contains(t, where["events/billing/cust-99"].LastError, blockedtest.GroupDeadError)
	require.Equal(t, 2, where["events/billing/cust-99"].Behind)
	require.Contains(t, where["events/billing/cust-5"].LastError, blockedtest.RetryError)

	r = run(t, db.DSN, "blocked", "orders", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "MESSAGE GROUP")
	require.Contains(t, r.stdout, "cust-99")
	require.Contains(t, r.stdout, blockedtest.QueueDeadError)
	require.NotContains(t, r.stdout, blockedtest.GroupDeadError, "only the topic named")
	r = run(t, db.DSN, "blocked", "events", "billing", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, blockedtest.GroupDeadError)
	require.NotContains(t, r.stdout, blockedtest.QueueDeadError)
	r = run(t, db.DSN, "blocked", "events", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, blockedtest.GroupDeadError, "a PUB_SUB topic's: every group's")

	r = run(t, db.DSN, "groups", "events", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	var groups []struct{ Waiting, Queued int64 }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &groups))
	require.Equal(t, []struct{ Waiting, Queued int64 }{{Waiting: 1, Queued: 3}}, groups,
		"cust-5's head waits for a retry; the three behind the heads are queued, not retries")
	r = run(t, db.DSN, "groups", "events", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "QUEUED")

	failsWith(t, run(t, db.DSN, "blocked", "nope", schema), 3, "not found")
	failsWith(t, run(t, db.DSN, "blocked", "events", "nobody", schema), 3, "nobody")
	failsWith(t, run(t, db.DSN, "blocked", "orders", "billing", schema), 2, "QUEUE")
	failsWith(t, run(t, db.DSN, "blocked", "a", "b", "c", schema), 2, "usage")

	r = run(t, db.DSN, "dead", "purge", "orders", fmt.Sprint(f.DeadHead), schema, "--json")
	require.Zero(t, r.code, r.stderr)
	require.JSONEq(t, `{"topic": "orders", "group": "", "purged": 1}`, r.stdout)
	r = run(t, db.DSN, "blocked", "orders", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	require.NotContains(t, r.stdout, "cust-99", "the dead letter purged, cust-99 goes on")
}

// Values the API refuses are refused here too, before anything is read:
// a negative --after or --older-than, a message id out of range (not
// taken for a group's name). Pausing a paused group succeeds. A QUEUE
// topic's leased messages are not counted as scheduled, and a topic with
// nothing ready shows no age for its oldest ready message.
func TestBoundsAndCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue, Ordered: true}))
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "later", Semantics: outbox.Queue}))
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	// orders is ordered: a consumer leases each message on its own.
	queuetest.Hold(t, db.Pool, client, outbox.Message{Topic: "orders", Group: "g", Payload: json.RawMessage(`{}`)})
	_, err = producer.SendBatch(ctx, db.Pool, []outbox.Message{
		{Topic: "orders", Group: "g", Payload: json.RawMessage(`{}`)},
		{Topic: "orders", Payload: json.RawMessage(`{}`), Delay: time.Hour},
		{Topic: "later", Payload: json.RawMessage(`{}`), Delay: time.Hour},
	})
	require.NoError(t, err)
	g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: "events", Group: "billing", Client: client})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Stop(ctx)
	})
	schema := "--schema=" + db.Schema

	failsWith(t, run(t, db.DSN, "dead", "list", "orders", "--after", "-5", schema), 2, "--after -5")
	failsWith(t, run(t, db.DSN, "stuck", "--older-than", "-1h", schema), 2, "--older-than -1h0m0s")
	failsWith(t, run(t, db.DSN, "dead", "replay", "orders", "99999999999999999999", schema), 2, "out of range")
	failsWith(t, run(t, db.DSN, "dead", "replay", "events", "billing", "1", "99999999999999999999", schema), 2, "out of range")

	for range 2 {
		r := run(t, db.DSN, "group", "pause", "events", "billing", schema)
		require.Zero(t, r.code, "pausing a paused group is what was asked: %s", r.stderr)
	}
	state, err := g.State(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.Paused, state)

	r := run(t, db.DSN, "topics", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	var topics []struct {
		Name                     string
		Ready, Scheduled, Leased *int64
		OldestReady              *float64 `json:"oldest_ready_seconds"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &topics))
	require.Len(t, topics, 3)
	later, orders := topics[1], topics[2]
	require.EqualValues(t, 1, *orders.Ready)
	require.EqualValues(t, 1, *orders.Scheduled, "the delayed one; the leased one is not scheduled")
	require.EqualValues(t, 1, *orders.Leased)
	require.NotNil(t, orders.OldestReady)
	require.Zero(t, *later.Ready)
	require.Nil(t, later.OldestReady, "nothing is ready, so nothing has waited")
	r = run(t, db.DSN, "topics", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "LEASED")
	for _, line := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(line, "later ") {
			require.NotContains(t, line, "0s", "no age for a topic with nothing ready: %q", line)
		}
	}
}

// `topics` lists a topic that holds messages without a configuration (it
// was deleted by hand), flagged, so an operator finds every stored message.
func TestTopicsFlagsUnconfiguredOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("outbox_published")+
		` (topic, payload, correlation_id, status) VALUES ('emials', '{}', 'c', 'PUBLISHED')`)
	require.NoError(t, err)
	schema := "--schema=" + db.Schema

	r := run(t, db.DSN, "topics", schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "emials")
	require.Contains(t, r.stdout, "QUEUE (unconfigured)")
	r = run(t, db.DSN, "topics", schema, "--json")
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, `"configured": false`)
}

// pgoutbox message: which groups finished a message, as a table or JSON.
func TestMessageCommand(t *testing.T) {
	t.Parallel()
	f := blockedtest.New(t)
	db := f.DB
	schema := "--schema=" + db.Schema
	r := run(t, db.DSN, "message", "events", fmt.Sprint(f.EventsMessage(t, "cust-5", 0)), schema, "--json")
	require.Zero(t, r.code, r.stderr)
	var rows []struct {
		Group, Status, State string
		Attempts             int
		LastError            string     `json:"last_error"`
		NextAttempt          *time.Time `json:"next_attempt"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows))
	require.Len(t, rows, 1, r.stdout)
	require.Equal(t, "billing", rows[0].Group)
	require.Equal(t, "ACTIVE", rows[0].Status)
	require.Equal(t, "RETRYING", rows[0].State)
	require.Equal(t, 1, rows[0].Attempts)
	require.Contains(t, rows[0].LastError, blockedtest.RetryError)
	require.NotNil(t, rows[0].NextAttempt)

	r = run(t, db.DSN, "message", "events", fmt.Sprint(f.EventsMessage(t, "cust-99", 0)), schema)
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, r.stdout, "NEXT ATTEMPT")
	require.Contains(t, r.stdout, "DEAD_LETTER")
	require.Contains(t, r.stdout, blockedtest.GroupDeadError)

	r = run(t, db.DSN, "message", "events", "999999999", schema)
	require.Equal(t, 3, r.code, r.stdout) // not found
	require.Contains(t, r.stderr, "not stored")
	for _, args := range [][]string{{"message", "events"}, {"message", "events", "x"}, {"message", "events", "0"}} {
		r = run(t, db.DSN, append(args, schema)...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
	}
}

// The CLI's --json and the web UI's JSON API write one shape per concept:
// the same reads give the same documents, key for key (docs/admin.md).
func TestJSONIsTheAdminAPIs(t *testing.T) {
	t.Parallel()
	f := blockedtest.New(t)
	adm, err := admin.New(f.Client, admin.Options{})
	require.NoError(t, err)
	ui, err := adminui.NewHandler(adminui.Config{Admin: adm, CacheFor: -1})
	require.NoError(t, err)
	srv := httptest.NewServer(ui)
	t.Cleanup(srv.Close)
	schema := "--schema=" + f.DB.Schema
	message := strconv.FormatInt(f.EventsMessage(t, "cust-99", 1), 10)

	for _, c := range []struct{ api, cli string }{
		{"/api/topics", "topics"},
		{"/api/topics/events/groups", "groups events"},
		{"/api/blocked", "blocked"},
		{"/api/topics/orders/blocked", "blocked orders"},
		{"/api/topics/orders/dead-letters", "dead list orders"},
		{"/api/topics/events/dead-letters?group=billing", "dead list events billing"},
		{"/api/topics/events/messages/" + message + "/groups", "message events " + message},
		{"/api/stuck?older_than_seconds=0", "stuck --older-than 0s"},
		{"/api/check", "check"},
	} {
		resp, err := http.Get(srv.URL + c.api)
		require.NoError(t, err)
		fromAPI, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(fromAPI))
		r := run(t, f.DB.DSN, append(strings.Fields(c.cli), schema, "--json")...)
		require.Zero(t, r.code, r.stderr)
		require.Equal(t, steady(t, fromAPI), steady(t, []byte(r.stdout)), "%s against pgoutbox %s --json", c.api, c.cli)
	}
}

// steady decodes a JSON document and zeroes what moves between two reads
// (ages and heartbeats), keeping every key.
func steady(t *testing.T, doc []byte) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(doc, &v), string(doc))
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				switch k {
				case "since_heartbeat_seconds", "oldest_ready_seconds", "lag_seconds", "last_heartbeat":
					v[k] = "(moves)"
				default:
					walk(x)
				}
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	return v
}

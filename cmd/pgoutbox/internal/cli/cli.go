// Package cli is the pgoutbox command: argument parsing, the commands, and
// their output. Run is main's whole body, so tests run it in-process.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1 // the database or an operation failed
	exitUsage    = 2 // a usage error or bad input
	exitNotFound = 3 // a topic, group or dead letter does not exist
)

const usage = `usage:
  pgoutbox [flags] migrate up|down|version|sql
  pgoutbox [flags] topics
  pgoutbox [flags] groups TOPIC
  pgoutbox [flags] group pause|resume|cancel|remove TOPIC GROUP
  pgoutbox [flags] group resurrect TOPIC GROUP [--no-backfill]
  pgoutbox [flags] group force-complete TOPIC GROUP --older-than DURATION
  pgoutbox [flags] dead list|replay|purge TOPIC [GROUP] [ID ...]
  pgoutbox [flags] blocked [TOPIC [GROUP]]   (message groups an ordered topic or group is held back on)
  pgoutbox [flags] message TOPIC ID          (which groups finished a message of a PUB_SUB topic)
  pgoutbox [flags] mode migrate TOPIC bitmap|counter|offset
  pgoutbox [flags] stuck [--older-than 1h]
  pgoutbox [flags] check      (exits 1 when a stored message's completion record does not add up)
flags: --dsn URL (default $DATABASE_URL) --schema NAME --json --payloads --after ID --limit N --from VERSION
       --group NAME (dead: a group whose name is a number) --all (dead purge: every one) --yes (migrate down)`

// usageError is bad input on the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// Run runs the command args (without the program name) and returns its
// exit status. getenv reads the environment.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	c := &command{out: stdout, getenv: getenv}
	err := c.run(ctx, args)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "pgoutbox: "+strings.ReplaceAll(err.Error(), "\n", " "))
	var u *usageError
	switch {
	case errors.As(err, &u):
		return exitUsage
	case errors.Is(err, outbox.ErrNotFound):
		return exitNotFound
	case errors.Is(err, outbox.ErrInvalidConfig), errors.Is(err, outbox.ErrInvalidTopic),
		errors.Is(err, consumergroup.ErrInvalidGroup), errors.Is(err, outbox.ErrWrongSemantics),
		errors.Is(err, migrations.ErrInvalidSchema), errors.Is(err, consumergroup.ErrInvalidTransition):
		return exitUsage
	}
	return exitFailed
}

// command holds the flags and what the commands share.
type command struct {
	out    io.Writer
	getenv func(string) string

	dsn, schema    string
	groupFlag      string        // dead: --group
	all            bool          // dead purge: every dead letter there
	olderThan      time.Duration // stuck, group force-complete: the bound
	olderThanSet   bool          // --older-than was given
	noBackfill     bool          // group resurrect: from now
	yes            bool          // migrate down: yes, drop the tables
	json, payloads bool
	after          int64
	limit          int
	from           uint
}

// parse parses flags anywhere among args and returns the other words.
func (c *command) parse(args []string) ([]string, error) {
	fs := flag.NewFlagSet("pgoutbox", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.dsn, "dsn", "", "")
	fs.StringVar(&c.schema, "schema", "public", "")
	fs.BoolVar(&c.json, "json", false, "")
	fs.BoolVar(&c.payloads, "payloads", false, "")
	fs.Int64Var(&c.after, "after", 0, "")
	fs.IntVar(&c.limit, "limit", 100, "")
	fs.UintVar(&c.from, "from", 0, "")
	fs.StringVar(&c.groupFlag, "group", "", "")
	fs.BoolVar(&c.all, "all", false, "")
	fs.DurationVar(&c.olderThan, "older-than", time.Hour, "")
	fs.BoolVar(&c.yes, "yes", false, "")
	fs.BoolVar(&c.noBackfill, "no-backfill", false, "")
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return []string{"help"}, nil
			}
			return nil, usagef("%v; run pgoutbox help", err)
		}
		fs.Visit(func(f *flag.Flag) { c.olderThanSet = c.olderThanSet || f.Name == "older-than" })
		if fs.NArg() == 0 {
			break
		}
		words = append(words, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if c.dsn == "" {
		c.dsn = c.getenv("DATABASE_URL")
	}
	if c.limit < 1 {
		return nil, usagef("--limit %d: must be at least 1", c.limit)
	}
	if c.after < 0 {
		return nil, usagef("--after %d: must not be negative (it is a message id, 0 for the start)", c.after)
	}
	if c.olderThan < 0 {
		return nil, usagef("--older-than %s: must not be negative", c.olderThan)
	}
	return words, nil
}

func (c *command) run(ctx context.Context, args []string) error {
	words, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(words) == 0 {
		return usagef("no command; run pgoutbox help")
	}
	switch cmd, rest := words[0], words[1:]; cmd {
	case "migrate":
		return c.migrate(ctx, rest)
	case "topics":
		if err := wantArgs(rest, 0, 0, "topics"); err != nil {
			return err
		}
		return c.withAdmin(ctx, c.topics)
	case "groups":
		if err := wantArgs(rest, 1, 1, "groups TOPIC"); err != nil {
			return err
		}
		return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error { return c.groups(ctx, a, rest[0]) })
	case "group":
		return c.group(ctx, rest)
	case "stuck":
		if err := wantArgs(rest, 0, 0, "stuck [--older-than DURATION]"); err != nil {
			return err
		}
		return c.withAdmin(ctx, c.stuck)
	case "dead":
		return c.dead(ctx, rest)
	case "blocked":
		if err := wantArgs(rest, 0, 2, "blocked [TOPIC [GROUP]]"); err != nil {
			return err
		}
		return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error { return c.blocked(ctx, a, rest) })
	case "message":
		if err := wantArgs(rest, 2, 2, "message TOPIC ID"); err != nil {
			return err
		}
		id, err := strconv.ParseInt(rest[1], 10, 64)
		if err != nil || id <= 0 {
			return usagef("message: %q is not a message id", rest[1])
		}
		return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error { return c.message(ctx, a, rest[0], id) })
	case "mode":
		return c.mode(ctx, rest)
	case "check":
		if err := wantArgs(rest, 0, 0, "check"); err != nil {
			return err
		}
		return c.withAdmin(ctx, c.check)
	case "help":
		_, err := fmt.Fprintln(c.out, usage)
		return err
	default:
		return usagef("unknown command %q; run pgoutbox help", cmd)
	}
}

func wantArgs(args []string, lo, hi int, form string) error {
	if len(args) < lo || len(args) > hi {
		return usagef("usage: pgoutbox %s", form)
	}
	return nil
}

// connect opens a pool on the database the flags name.
func (c *command) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if c.dsn == "" {
		return nil, usagef("no database: give --dsn or set DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(c.dsn)
	if err != nil {
		return nil, usagef("--dsn: %v", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

func (c *command) withAdmin(ctx context.Context, f func(context.Context, *admin.Admin) error) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Check(ctx, pool, migrations.Config{Schema: c.schema}); err != nil {
		return err
	}
	// The commands report through their result: the library's logs
	// (the client's start-up line) would break "one line on stderr".
	quiet := slog.New(slog.DiscardHandler)
	client, err := outbox.NewClient(pool, outbox.Config{Schema: c.schema, PollOnly: true, Logger: quiet})
	if err != nil {
		return err
	}
	a, err := admin.New(client, admin.Options{})
	if err != nil {
		return err
	}
	return f(ctx, a)
}

func (c *command) migrate(ctx context.Context, args []string) error {
	if err := wantArgs(args, 1, 1, "migrate up|down|version|sql"); err != nil {
		return err
	}
	cfg := migrations.Config{Schema: c.schema, Logger: slog.New(slog.DiscardHandler)}
	if args[0] == "sql" {
		script, err := migrations.SQL(c.schema, c.from)
		if err != nil {
			return err
		}
		_, err = io.WriteString(c.out, script)
		return err
	}
	switch args[0] {
	case "up", "down", "version":
	default:
		return usagef("usage: pgoutbox migrate up|down|version|sql")
	}
	if args[0] == "down" && !c.yes {
		return usagef("migrate down drops pgoutbox's tables and every message in them; add --yes to do it")
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch args[0] {
	case "up":
		err = migrations.Up(ctx, pool, cfg)
	case "down":
		err = migrations.Down(ctx, pool, cfg)
	}
	if err != nil {
		return err
	}
	v, err := migrations.Version(ctx, pool, cfg)
	if err != nil {
		return err
	}
	return c.print(map[string]any{"schema": c.schema, "version": v, "latest": migrations.Latest()},
		func(w io.Writer) {
			fmt.Fprintf(w, "schema %s at version %d (this release's latest: %d)\n", c.schema, v, migrations.Latest())
		})
}

// print writes v as JSON with --json, else what text writes.
func (c *command) print(v any, text func(io.Writer)) error {
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	text(tw)
	return tw.Flush()
}

func (c *command) topics(ctx context.Context, a *admin.Admin) error {
	topics, err := a.Topics(ctx)
	if err != nil {
		return err
	}
	return c.print(topics, func(w io.Writer) {
		fmt.Fprintln(w, "TOPIC\tSEMANTICS\tTRACKING\tORDERED\tREADY\tSCHEDULED\tLEASED\tOLDEST READY\tDEAD LETTERS\tGROUPS")
		for _, t := range topics {
			ready, scheduled, leased, oldest, dead := "-", "-", "-", "-", "-"
			if t.Semantics == outbox.Queue {
				ready, scheduled, dead = a.FormatCount(t.Ready), a.FormatCount(t.Scheduled), a.FormatCount(t.DeadLetters)
				leased = a.FormatCount(t.Leased)
				if t.Ready > 0 {
					oldest = age(t.OldestReady)
				}
			}
			tracking := dash(string(t.Tracking))
			if t.ModeChanging {
				tracking += " (changing)"
			}
			semantics := string(t.Semantics)
			if !t.Configured {
				semantics += " (unconfigured)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, semantics, tracking, t.Ordered,
				ready, scheduled, leased, oldest, dead, dash(strings.Join(t.Groups, ",")))
		}
	})
}

func (c *command) groups(ctx context.Context, a *admin.Admin, topic string) error {
	hs, err := a.Groups(ctx, topic)
	if err != nil {
		return err
	}
	return c.print(hs, func(w io.Writer) {
		fmt.Fprintln(w, "GROUP\tSTATE\tHEARTBEAT\tUNREAD\tQUEUED\tLEASED\tRETRIES\tDEAD LETTERS\tLAG\tBACKFILL")
		for _, h := range hs {
			state := string(h.State)
			if h.NearTimeout() {
				state += " (near timeout)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s ago\t%s\t%s\t%d+%d\t%s\t%s\t%s\t%s\n", h.Group, state, age(h.SinceHeartbeat),
				a.FormatCount(h.Unread), a.FormatCount(h.Queued), h.LeasedBatches, h.LeasedRetries, a.FormatCount(h.Waiting), a.FormatCount(h.DeadLetters), age(h.Lag),
				dash(backfill(h.Backfill)))
		}
	})
}

// stuck prints what has waited longer than --older-than.
func (c *command) stuck(ctx context.Context, a *admin.Admin) error {
	s, err := a.Stuck(ctx, c.olderThan)
	if err != nil {
		return err
	}
	type row struct {
		topic, group, state string
		oldest              time.Duration
	}
	var rows []row
	for _, t := range s.Topics {
		rows = append(rows, row{topic: t.Name, oldest: t.OldestReady})
	}
	for _, h := range s.Groups {
		rows = append(rows, row{topic: h.Topic, group: h.Group, state: string(h.State), oldest: h.Lag})
	}
	return c.print(s, func(w io.Writer) {
		fmt.Fprintln(w, "TOPIC\tGROUP\tSTATE\tOLDEST WAITING")
		for _, r := range rows {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", r.topic, dash(r.group), dash(r.state), age(r.oldest))
		}
	})
}

// blocked prints the message groups ordered topics and groups are held
// back on: every one, a topic's (a PUB_SUB topic's: each of its groups'),
// or a group's.
func (c *command) blocked(ctx context.Context, a *admin.Admin, args []string) error {
	var found []admin.Blocked
	var err error
	switch len(args) {
	case 0:
		found, err = a.Blocked(ctx, c.limit)
	case 1:
		found, err = a.TopicBlocked(ctx, args[0], c.limit)
	default:
		var bs []outbox.BlockedGroup
		bs, err = a.BlockedGroups(ctx, args[0], args[1], c.limit)
		for _, b := range bs {
			found = append(found, admin.Blocked{Topic: args[0], ConsumerGroup: args[1], BlockedGroup: b})
		}
	}
	if err != nil {
		return err
	}
	if found == nil {
		found = []admin.Blocked{}
	}
	return c.print(found, func(w io.Writer) {
		fmt.Fprintln(w, "TOPIC\tGROUP\tMESSAGE GROUP\tHEAD\tATTEMPTS\tSINCE\tBEHIND\tLAST ERROR")
		for _, v := range found {
			head := strconv.FormatInt(v.HeadID, 10)
			if v.DeadLettered {
				head += " (dead letter)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", v.Topic, dash(v.ConsumerGroup), printable(v.Group), head,
				v.Attempts, v.Since.UTC().Format(time.RFC3339), v.Behind, oneLine(v.LastError, 60))
		}
	})
}

func backfill(p consumergroup.BackfillProgress) string {
	switch {
	case p.StartedAt.IsZero():
		return ""
	case p.Running:
		return fmt.Sprintf("running %d/%d", p.Done, p.Total)
	default:
		return fmt.Sprintf("%s %d", strings.ToLower(p.Outcome), p.Done)
	}
}

func (c *command) group(ctx context.Context, args []string) error {
	const form = "group pause|resume|cancel|remove|resurrect|force-complete TOPIC GROUP"
	if err := wantArgs(args, 3, 3, form); err != nil {
		return err
	}
	ops := map[string]func(*admin.Admin, context.Context, string, string) error{
		"pause": (*admin.Admin).PauseGroup, "resume": (*admin.Admin).ResumeGroup,
		"cancel": (*admin.Admin).CancelGroup, "remove": (*admin.Admin).RemoveGroup,
		"resurrect": func(a *admin.Admin, ctx context.Context, topic, group string) error {
			return a.ResurrectGroup(ctx, topic, group, !c.noBackfill)
		},
	}
	if args[0] == "force-complete" {
		return c.forceComplete(ctx, args[1], args[2])
	}
	op, ok := ops[args[0]]
	if !ok {
		return usagef("usage: pgoutbox %s", form)
	}
	if c.noBackfill && args[0] != "resurrect" {
		return usagef("--no-backfill goes with group resurrect only")
	}
	return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error {
		if err := op(a, ctx, args[1], args[2]); err != nil {
			return err
		}
		return c.print(map[string]string{"topic": args[1], "group": args[2], "done": args[0]}, func(w io.Writer) {
			fmt.Fprintf(w, "%s: group %s of %s\n", args[0], args[2], args[1])
		})
	})
}

// forceComplete gives up a group's messages older than --older-than,
// which must be given (a default would give up messages by accident).
func (c *command) forceComplete(ctx context.Context, topic, group string) error {
	if !c.olderThanSet {
		return usagef("group force-complete gives messages up for good: say which with --older-than DURATION")
	}
	return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error {
		n, err := a.ForceComplete(ctx, topic, group, c.olderThan)
		if err != nil {
			return err
		}
		return c.print(map[string]any{"topic": topic, "group": group, "completed": n}, func(w io.Writer) {
			fmt.Fprintf(w, "force-completed %d messages of group %s of %s\n", n, group, topic)
		})
	})
}

// mode changes a topic's tracking mode online.
func (c *command) mode(ctx context.Context, args []string) error {
	const form = "mode migrate TOPIC bitmap|counter|offset"
	if err := wantArgs(args, 3, 3, form); err != nil || args[0] != "migrate" {
		return usagef("usage: pgoutbox %s", form)
	}
	mode := outbox.TrackingMode(strings.ToUpper(args[2]))
	switch mode {
	case outbox.Bitmap, outbox.Counter, outbox.Offset:
	default:
		return usagef("%q is not a tracking mode (bitmap, counter or offset)", args[2])
	}
	return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error {
		if err := a.ChangeMode(ctx, args[1], mode); err != nil {
			return err
		}
		return c.print(map[string]string{"topic": args[1], "mode": string(mode)}, func(w io.Writer) {
			fmt.Fprintf(w, "topic %s now tracks new messages in %s mode; stored ones keep theirs until cleanup deletes them\n", args[1], mode)
			fmt.Fprintln(w, "configure the topic with this mode in your services too (until then they log a warning at start)")
		})
	})
}

// errInconsistent makes check exit 1 once it printed what it found.
var errInconsistent = errors.New("stored messages whose completion record does not add up (see above)")

// check prints the stored messages whose completion record does not add up.
// message prints which groups finished a message, and where the others
// stand with it.
func (c *command) message(ctx context.Context, a *admin.Admin, topic string, id int64) error {
	gs, err := a.MessageGroups(ctx, topic, id)
	if err != nil {
		return err
	}
	return c.print(gs, func(w io.Writer) {
		fmt.Fprintln(w, "GROUP\tSTATUS\tSTATE\tATTEMPTS\tNEXT ATTEMPT\tLAST ERROR")
		for _, v := range gs {
			next := "-"
			if v.NextAttempt != nil {
				next = v.NextAttempt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", v.ConsumerGroup, v.Status, v.State, v.Attempts, next, dash(oneLine(v.LastError, 60)))
		}
	})
}

func (c *command) check(ctx context.Context, a *admin.Admin) error {
	found, err := a.Inconsistencies(ctx)
	if err != nil {
		return err
	}
	if found == nil {
		found = []consumergroup.Inconsistency{}
	}
	err = c.print(found, func(w io.Writer) {
		if len(found) == 0 {
			fmt.Fprintln(w, "every stored message's completion record adds up")
			return
		}
		fmt.Fprintln(w, "TOPIC\tKIND\tMESSAGES\tFIRST ID")
		for _, r := range found {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\n", r.Topic, r.Kind, a.FormatCount(r.Messages), r.FirstID)
		}
	})
	if err == nil && len(found) > 0 {
		err = errInconsistent
	}
	return err
}

func (c *command) dead(ctx context.Context, args []string) error {
	const form = "dead list|replay|purge TOPIC [GROUP] [ID ...]"
	if len(args) < 2 {
		return usagef("usage: pgoutbox %s", form)
	}
	op, topic, rest := args[0], args[1], args[2:]
	// GROUP is the first word that is not a number; --group names one
	// that is.
	group := c.groupFlag
	if len(rest) > 0 && group == "" && !isNumber(rest[0]) {
		group, rest = rest[0], rest[1:]
	}
	ids := make([]int64, len(rest))
	for i, s := range rest {
		id, err := messageID(s)
		if err != nil {
			return err
		}
		ids[i] = id
	}
	switch op {
	case "list":
		if len(ids) > 0 {
			return usagef("usage: pgoutbox dead list TOPIC [GROUP] (with --after and --limit)")
		}
		return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error { return c.listDead(ctx, a, topic, group) })
	case "replay", "purge":
		if op == "purge" && len(ids) == 0 && !c.all {
			return usagef("dead purge deletes for good: name the ids, or add --all for every dead letter there")
		}
		if len(ids) > 0 && c.all {
			return usagef("give ids or --all, not both")
		}
		return c.withAdmin(ctx, func(ctx context.Context, a *admin.Admin) error {
			f := a.ReplayDeadLetters
			if op == "purge" {
				f = a.DiscardDeadLetters
			}
			done := map[string]string{"replay": "replayed", "purge": "purged"}[op]
			n, err := f(ctx, topic, group, ids...)
			if err != nil && n > 0 { // the others were done: say so
				err = fmt.Errorf("%s %d; %w", done, n, err)
			}
			if err != nil {
				return err
			}
			return c.print(map[string]any{"topic": topic, "group": group, done: n}, func(w io.Writer) {
				fmt.Fprintf(w, "%s %d dead letters\n", done, n)
			})
		})
	default:
		return usagef("usage: pgoutbox %s", form)
	}
}

func (c *command) listDead(ctx context.Context, a *admin.Admin, topic, group string) error {
	dls, err := a.DeadLetters(ctx, topic, group, c.after, c.limit)
	if err != nil {
		return err
	}
	views := make([]admin.DeadLetterView, len(dls))
	for i, d := range dls {
		views[i] = admin.View(d, c.payloads)
	}
	return c.print(views, func(w io.Writer) {
		header := "ID\tMESSAGE GROUP\tATTEMPTS\tDEAD LETTERED\tLAST ERROR"
		if c.payloads {
			header += "\tPAYLOAD"
		}
		fmt.Fprintln(w, header)
		for _, v := range views {
			fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s", v.ID, dash(v.MessageGroup), v.Attempts,
				v.DeadLetteredAt.UTC().Format(time.RFC3339), oneLine(v.LastError, 60))
			if c.payloads {
				fmt.Fprintf(w, "\t%s", printable(string(v.Payload)))
			}
			fmt.Fprintln(w)
		}
	})
}

// isNumber reports whether s is written as a whole number, whatever its
// size.
func isNumber(s string) bool {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "-"), "+")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// messageID reads a message id from the command line.
func messageID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 0, usagef("message id %s is out of range (1 to %d)", s, int64(math.MaxInt64))
	}
	if err != nil || id < 1 {
		return 0, usagef("%q is not a message id", s)
	}
	return id, nil
}

func age(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return d.Round(time.Second).String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string, max int) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// printable replaces control characters (a terminal's escape sequences,
// from message data) with U+FFFD.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return unicode.ReplacementChar
		}
		return r
	}, s)
}

// Command pgoutbox runs pgoutbox's migrations and lets an operator see and
// steer topics, consumer groups and dead letters from a shell.
//
// Install it with
//
//	go install github.com/pgoutbox/pgoutbox/cmd/pgoutbox@latest
//
// Usage:
//
//	pgoutbox [flags] migrate up|down|version|sql
//	pgoutbox [flags] topics
//	pgoutbox [flags] groups TOPIC
//	pgoutbox [flags] group pause|resume|cancel|remove TOPIC GROUP
//	pgoutbox [flags] dead list|replay|purge TOPIC [GROUP] [ID ...]
//	pgoutbox [flags] stuck [--older-than 1h]
//
// Flags, before or after the command:
//
//	--dsn URL       the database (default: $DATABASE_URL)
//	--schema NAME   the schema holding pgoutbox's tables (default: public)
//	--json          print JSON instead of a table
//	--payloads      show message payloads and headers (dead list); they
//	                may hold personal data, so they are hidden by default
//	--after ID      dead list: start after this id
//	--limit N       dead list: at most N (default 100)
//	--group NAME    dead: the group, when its name is a number
//	--all           dead purge: every dead letter there (purge never takes
//	                all of them without it)
//	--yes           migrate down: yes, drop the tables and their messages
//	--older-than D  stuck: list QUEUE topics and groups whose oldest
//	                waiting message is older than D (default 1h)
//
// "dead" names a QUEUE topic's dead letters with TOPIC alone, a group's with
// TOPIC GROUP (the first word after TOPIC that is not a number). Replay
// takes every dead letter there unless ids are given; purge takes the ids
// given, or every one with --all. "migrate sql" prints the SQL of every migration, in order, for
// users of another migration tool (goose, atlas, sqitch).
//
// Exit status: 0 on success, 1 when the database or an operation failed,
// 2 for a usage error or bad input, 3 when a topic, group or dead letter
// was not found. Errors are one line on standard error.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgoutbox/pgoutbox/cmd/pgoutbox/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

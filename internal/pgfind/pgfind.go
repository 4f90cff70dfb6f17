// Package pgfind finds a PostgreSQL server to run against, for tests and
// examples, in this order:
//
//  1. the DSN in a given environment variable (an explicit choice that does
//     not answer is an error, not a reason to fall back);
//  2. a server on 127.0.0.1:5432, user postgres;
//  3. an ephemeral cluster started from local initdb/pg_ctl binaries in a
//     temporary directory (Server.Stop removes it);
//  4. otherwise an error that says what to set.
package pgfind

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LocalDSN is the conventional local server.
const LocalDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Server is a reachable PostgreSQL server.
type Server struct {
	// AdminDSN connects to database "postgres" on the server.
	AdminDSN string
	// Source says where the server came from, for messages.
	Source  string
	cluster *cluster
}

// Stop stops the server if Locate started it; otherwise it does nothing.
func (s *Server) Stop() {
	if s != nil && s.cluster != nil {
		s.cluster.stop()
	}
}

// Locate finds a server; envVar names the variable that may hold a DSN.
func Locate(ctx context.Context, envVar string) (*Server, error) {
	var tried []string
	if dsn := os.Getenv(envVar); dsn != "" {
		admin, err := WithDatabase(dsn, "postgres")
		if err == nil {
			if err = Ping(ctx, admin); answers(err) {
				err = nil
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envVar, err)
		}
		return &Server{AdminDSN: admin, Source: envVar}, nil
	}
	if err := Ping(ctx, LocalDSN); answers(err) {
		return &Server{AdminDSN: LocalDSN, Source: "127.0.0.1:5432"}, nil
	} else {
		tried = append(tried, fmt.Sprintf("127.0.0.1:5432: %v", err))
	}
	s, err := StartCluster(ctx)
	if err == nil {
		return s, nil
	}
	tried = append(tried, fmt.Sprintf("ephemeral cluster: %v", err))
	return nil, fmt.Errorf("no PostgreSQL server: set %s to a server where the user may CREATE DATABASE; tried:\n  %s",
		envVar, strings.Join(tried, "\n  "))
}

// Ping connects to dsn and disconnects, within 3 seconds.
func Ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// TooManyConnections reports whether err is the server refusing a
// connection because it has no free connection slot (SQLSTATE 53300:
// "sorry, too many clients already", or a role's or database's limit).
func TooManyConnections(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "53300" // too_many_connections
}

// answers reports whether a Ping's outcome shows a server there: one that
// is full right now answers too (the tests' connections wait for a slot).
func answers(pingErr error) bool { return pingErr == nil || TooManyConnections(pingErr) }

// WithDatabase returns dsn pointed at database db.
func WithDatabase(dsn, db string) (string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	cred := cfg.User
	if cfg.Password != "" {
		cred += ":" + cfg.Password
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cred, cfg.Host, cfg.Port, db), nil
}

// HostPort returns the host and port a DSN points to.
func HostPort(dsn string) (string, uint16, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", 0, err
	}
	return cfg.Host, cfg.Port, nil
}

package natsrelay

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// NATSConfig says how to connect to NATS. Give at most one of
// CredentialsFile, NKeySeedFile, Token and User/Password.
type NATSConfig struct {
	// URL is the server's URL, or several separated by commas.
	// Defaults to nats.DefaultURL (nats://127.0.0.1:4222).
	URL string
	// Name names the connection in the server's monitoring.
	// Defaults to "pgoutbox-relay".
	Name string
	// CredentialsFile is a user credentials file (a user JWT and its
	// NKey seed, as nsc writes it).
	CredentialsFile string
	// NKeySeedFile is a file holding a user NKey seed.
	NKeySeedFile string
	// Token is an authentication token.
	Token string
	// User and Password authenticate with a user name and password.
	User, Password string
	// TLS, when set, makes the connection use TLS with this
	// configuration (its RootCAs to trust the server, its Certificates
	// for a client certificate). A tls:// URL uses TLS too.
	TLS *tls.Config
	// Logger receives the connection's disconnects, reconnects and
	// asynchronous errors (a permission violation, say). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Options are further nats.go options, applied last.
	Options []nats.Option
}

// Connect connects to NATS as cfg says. The connection reconnects
// forever, and is returned even while no server answers (publishes then
// fail, and the relay retries them), so a relay can start before NATS.
func Connect(cfg NATSConfig) (*nats.Conn, error) {
	auths := 0
	for _, set := range []bool{cfg.CredentialsFile != "", cfg.NKeySeedFile != "", cfg.Token != "", cfg.User != "" || cfg.Password != ""} {
		if set {
			auths++
		}
	}
	if auths > 1 {
		return nil, fmt.Errorf("%w: give at most one of CredentialsFile, NKeySeedFile, Token and User/Password", outbox.ErrInvalidConfig)
	}
	logger := cmp.Or(cfg.Logger, slog.Default())
	events := ratelog.New(logger, time.Minute, time.Now)
	opts := []nats.Option{
		nats.Name(cmp.Or(cfg.Name, "pgoutbox-relay")),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("pgoutbox: NATS connection lost; reconnecting", slog.Any("error", err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Info("pgoutbox: NATS connection restored", slog.String("url", nc.ConnectedUrlRedacted()))
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil { // not closed by its owner
				logger.Error("pgoutbox: NATS connection closed; it will not reconnect", slog.Any("error", err))
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			events.Log(slog.LevelError, "nats-error|"+err.Error(), "pgoutbox: NATS reported an error", slog.Any("error", err))
		}),
	}
	switch {
	case cfg.CredentialsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredentialsFile))
	case cfg.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: NKeySeedFile: %v", outbox.ErrInvalidConfig, err)
		}
		opts = append(opts, opt)
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.User != "" || cfg.Password != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.TLS != nil {
		opts = append(opts, nats.Secure(cfg.TLS))
	}
	opts = append(opts, cfg.Options...)
	return nats.Connect(cmp.Or(cfg.URL, nats.DefaultURL), opts...)
}

// EnsureStream creates the stream cfg describes, or updates it to cfg,
// with its duplicate window (Duplicates) set to DefaultDuplicateWindow
// when cfg leaves it zero. JetStream's own default is two minutes, too
// short for a relay: the window must cover the longest time between a
// message's first publish and its republish (see the package
// documentation).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if cfg.Duplicates == 0 {
		cfg.Duplicates = DefaultDuplicateWindow
	}
	return js.CreateOrUpdateStream(ctx, cfg)
}

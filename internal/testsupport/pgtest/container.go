package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
)

// containerImage is the server image used when the finder falls back to
// Docker through testcontainers-go.
const containerImage = "postgres:16-alpine"

// startContainer runs PostgreSQL in Docker (the finder's last resort),
// with these server settings ("max_connections=4", ...). It fails fast
// when no Docker engine answers.
func startContainer(ctx context.Context, settings ...string) (*pgfind.Server, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	opts := []testcontainers.ContainerCustomizer{
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	}
	for _, s := range settings {
		opts = append(opts, testcontainers.WithCmdArgs("-c", s))
	}
	c, err := tcpostgres.Run(ctx, containerImage, opts...)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return nil, nil, err
	}
	dsn, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return nil, nil, err
	}
	stop := func() { _ = testcontainers.TerminateContainer(c) }
	return &pgfind.Server{AdminDSN: dsn, Source: fmt.Sprintf("testcontainers (%s)", containerImage)}, stop, nil
}

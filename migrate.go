package pgdispatch

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch/migrations"
)

// MigrateConfig configures MigrateWith. The zero value of every field
// means its default.
type MigrateConfig struct {
	// Schema is migrated. Default: DefaultSchema.
	Schema string
	// ListenURL is the pool's PoolConfig.ListenURL. When the pool goes
	// through a transaction pooler (BehindPooler), the migrations run over a
	// pool of their own to ListenURL: a migration holds a session-level
	// advisory lock and session settings, which a pooler would leave on a
	// server connection that other clients then get.
	ListenURL string
	// StatementTimeout bounds each call, as PoolConfig.StatementTimeout
	// does; a DDL statement waits for a lock the smaller of it and 5s.
	// Default: DefaultStatementTimeout.
	StatementTimeout time.Duration
}

// Migrate brings schema up to date on pool; see package migrations.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, _, err := MigrateWith(ctx, pool, MigrateConfig{Schema: schema})
	return err
}

// MigrateWith brings cfg.Schema up to date, on pool or past its pooler,
// and returns the versions it found and left. Many processes may run it
// at once: one migrates, the others wait for it.
func MigrateWith(ctx context.Context, pool *pgxpool.Pool, cfg MigrateConfig) (from, to int32, err error) {
	timeout := cmp.Or(cfg.StatementTimeout, DefaultStatementTimeout)
	if BehindPooler(pool.Config().ConnString(), cfg.ListenURL) {
		direct, err := NewPool(ctx, cfg.ListenURL, PoolConfig{StatementTimeout: timeout, ListenURL: cfg.ListenURL})
		if err != nil {
			return 0, 0, fmt.Errorf("migrate over the listen URL (LISTEN_DATABASE_URL): %w", err)
		}
		defer direct.Close()
		pool = direct
	}
	return migrations.Migrate(ctx, pool, migrations.Config{Schema: cmp.Or(cfg.Schema, DefaultSchema), LockTimeout: min(timeout, 5*time.Second)})
}

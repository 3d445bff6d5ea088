package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch/internal/stmtcount"
)

// idle: what a worker with nothing to do sends: the transactions and
// statements of its pool (a tracer counts them), and the transactions its
// database commits, autovacuum's included.
func (b *bench) idle(ctx context.Context) ([]*Result, error) {
	// In a database of its own when the role may create one, so that the
	// commit count is the worker's alone and not also autovacuum's work on
	// the tables the other scenarios dropped.
	counter := &stmtcount.Counter{}
	ib, database, dropDB, err := b.idleBench(ctx, counter)
	if err != nil {
		return nil, err
	}
	defer dropDB()
	_, _, cleanup, err := ib.worker(ctx, 0, nil)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// Statistics reach pg_stat_database within about 10 s of a backend
	// going idle: let the worker's start-up settle first (less on a short
	// run, whose figure is then only indicative).
	time.Sleep(min(12*time.Second, b.opts.IdleDuration))
	before, err := b.xactCommit(ctx, database)
	if err != nil {
		return nil, err
	}
	tx, st := counter.Transactions.Load(), counter.Statements.Load()
	time.Sleep(b.opts.IdleDuration)
	after, err := b.xactCommit(ctx, database)
	if err != nil {
		return nil, err
	}
	perMinute := float64(time.Minute) / float64(b.opts.IdleDuration)
	r := &Result{Scenario: "idle", Conditions: fmt.Sprintf("one idle worker for %s, POLL_INTERVAL=%s, SWEEP_INTERVAL=%s, one queue, database %s",
		b.opts.IdleDuration, b.base.PollInterval, b.base.SweepInterval, database)}
	r.set("worker_transactions_per_min", float64(counter.Transactions.Load()-tx)*perMinute)
	r.set("worker_statements_per_min", float64(counter.Statements.Load()-st)*perMinute)
	r.set("transactions", float64(after-before))
	return []*Result{r}, nil
}

// idleBench returns a bench whose pool counts what it sends with counter,
// on a fresh database when the role may create one (else on b's), the
// database's name, and a func that closes the pool and drops the database.
func (b *bench) idleBench(ctx context.Context, counter *stmtcount.Counter) (*bench, string, func(), error) {
	buf := make([]byte, 4)
	_, _ = rand.Read(buf)
	name := "pgdispatch_bench_idle_" + hex.EncodeToString(buf)
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.Tracer = counter
	drop := func() {}
	if _, err := b.pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		name = cfg.ConnConfig.Database
		fmt.Fprintf(b.log, "bench: idle: counting commits in %s, shared with the other scenarios (CREATE DATABASE: %v)\n", name, err)
	} else {
		drop = func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_, _ = b.pool.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		}
		cfg.ConnConfig.Database = name
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	ib := *b
	ib.pool = pool
	ib.base.Pool = pool
	ib.base.ListenConnConfig = b.base.ListenConnConfig.Copy()
	ib.base.ListenConnConfig.Database = name
	return &ib, name, func() { pool.Close(); drop() }, nil
}

// xactCommit reads pg_stat_database.xact_commit of database, from a
// connection to b's own database so that reading it adds nothing to it.
func (b *bench) xactCommit(ctx context.Context, database string) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", database).Scan(&n)
	return n, err
}

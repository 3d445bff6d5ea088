// Package pgtest gives tests a real PostgreSQL and an isolated pgdispatch
// schema per test.
//
// The server is TEST_DATABASE_URL when set, else the one on 127.0.0.1:5432
// when it answers, else a throwaway cluster started for the test binary (see
// package pgcluster). With none of them the tests fail with a clear message;
// they never pass by skipping.
//
// Each test gets a migrated schema of its own (Schema). The NOTIFY channel
// and the advisory locks are keyed by the schema, so tests running in
// parallel never hear or block each other. Migrating a schema is most of a
// short test's time, so a test binary keeps the schemas its tests are done
// with and hands them, emptied, to later tests, as River's
// riverdbtest.TestSchema does, and drops them when it ends. A test that
// needs a schema nothing ran on asks for FreshSchema.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

const localURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	url     string
	cluster *pgcluster.Cluster
	pool    *pgxpool.Pool
	poolMu  sync.Mutex
	// ddlConns makes, readies and drops the test schemas. Its commits do
	// not wait for the WAL to reach the disk: a crash of the server loses
	// nothing a test needs, and a migration commits at every step.
	ddlConns *pgxpool.Pool
)

// Main is for TestMain: it finds or starts a server, runs the tests, and
// stops a throwaway server again.
func Main(m interface{ Run() int }) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m interface{ Run() int }) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	url, err = resolve(ctx)
	if err != nil {
		return 1, err
	}
	defer func() {
		if err := disown(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
		if err := ddl.report(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
		closePool()
		if cluster != nil {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "pgtest:", err)
			}
		}
	}()
	if err := own(ctx, url); err != nil {
		return 1, fmt.Errorf("own the test schemas: %w", err)
	}
	return m.Run(), nil
}

func resolve(ctx context.Context) (string, error) {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		if err := ping(ctx, u); err != nil {
			return "", fmt.Errorf("TEST_DATABASE_URL is set but does not answer: %w", err)
		}
		return u, nil
	}
	if err := ping(ctx, localURL); err == nil {
		return localURL, nil
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL for the tests: TEST_DATABASE_URL is unset, nothing answers on 127.0.0.1:5432, "+
			"and a throwaway cluster could not start: %w", err)
	}
	cluster = c
	return c.URL(), nil
}

func ping(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// closePool closes the shared pools, if a test opened them.
func closePool() {
	poolMu.Lock()
	defer poolMu.Unlock()
	for _, p := range []**pgxpool.Pool{&pool, &ddlConns} {
		if *p != nil {
			(*p).Close()
			*p = nil
		}
	}
}

// URL is the server's connection string. It is valid once Main has started.
func URL() string { return url }

// Cluster is the throwaway cluster, or nil when the tests use another server.
func Cluster() *pgcluster.Cluster { return cluster }

// Pool is the test binary's shared pool.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	poolMu.Lock()
	defer poolMu.Unlock()
	if pool == nil {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		cfg.MaxConns = 20
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "30s"
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = "10s"
		pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	return pool
}

// ddlPool is the pool of ddlConns.
func ddlPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	poolMu.Lock()
	defer poolMu.Unlock()
	if ddlConns == nil {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		cfg.MaxConns = 4
		cfg.ConnConfig.RuntimeParams["application_name"] = "pgtest-schemas"
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "60s"
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = "10s"
		ddlConns, err = pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	return ddlConns
}

// LockWaitingPool is a pool of the test's own, closed when the test ends,
// whose sessions wait for a lock as long as their context allows (no
// lock_timeout, unlike Pool's): a lock timeout its test meets is the one
// the code under test set.
func LockWaitingPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "0"
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "60s"
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// UnpingedPool is a pool of maxConns connections named app (returned) in
// pg_stat_activity, closed when the test ends, that hands out its idle
// connections without a ping, as cmd/pgdispatch's does for those idle for
// less than minutes: a dead one is found by its use.
func UnpingedPool(ctx context.Context, t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	app := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(p.Close)
	return p, app
}

// FillPool opens every connection pool may hold and leaves them idle in it,
// so that after a termination every connection it hands out is dead.
func FillPool(ctx context.Context, t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	for i := range conns {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatalf("pgtest: fill the pool: %v", err)
		}
		conns[i] = conn
	}
	for _, conn := range conns {
		conn.Release()
	}
}

// TerminateApp terminates the sessions named app and returns how many
// ended: it waits up to 30 s for each (a loaded machine can take seconds to
// schedule a backend that is told to exit).
func TerminateApp(ctx context.Context, t testing.TB, app string) int {
	t.Helper()
	var killed int
	if err := Pool(t).QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000))
		FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&killed); err != nil {
		t.Fatalf("pgtest: terminate %s: %v", app, err)
	}
	return killed
}

// WaitSQL waits until query, a statement that returns one boolean, returns
// true on the shared pool, failing the test after timeout or at the
// statement's first error.
func WaitSQL(t testing.TB, timeout time.Duration, what, query string, args ...any) {
	t.Helper()
	wait.For(t, timeout, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var ok bool
		if err := Pool(t).QueryRow(ctx, query, args...).Scan(&ok); err != nil {
			t.Fatalf("pgtest: waiting for %s: %v", what, err)
		}
		return ok
	})
}

// Conn opens a connection of the test's own, outside the pool, and closes
// it when the test ends: for sessions that hold locks, LISTEN, or keep a
// transaction open.
func Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { closeConn(conn) })
	return conn
}

// closeConn closes conn and waits until its socket is closed too. A
// connection whose statement a cancelled context cut short is already
// closing in the background (pgconn's asyncClose: a cancel request, then a
// drain until the server hangs up, up to 15 s), and Close returns at once;
// the test binary's leak check would find that goroutine.
func closeConn(conn *pgx.Conn) {
	_ = conn.Close(context.Background())
	<-conn.PgConn().CleanupDone()
}

// MainNoLeaks is Main for packages that start goroutines: after the tests
// pass, it fails the binary if they left any goroutine running.
func MainNoLeaks(m *testing.M) { Main(leakCheck{m}) }

type leakCheck struct{ m *testing.M }

func (l leakCheck) Run() int {
	ignore := goleak.IgnoreCurrent()
	if code := l.m.Run(); code != 0 {
		return code
	}
	// Closed first: a pooled connection can keep a goroutine reading after
	// its last statement (pgconn's background reader, started when a write
	// took over 15 ms, waits in its Read until the next message or the
	// close), which is not a leak of the code under test.
	closePool()
	if err := goleak.Find(ignore, goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}

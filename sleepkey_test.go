package pgdispatch_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// startLog is an executor that records when each job started, and lets
// waiters block until a set of jobs has.
type startLog struct {
	mu      sync.Mutex
	started map[int64]time.Time
	changed chan struct{} // closed and replaced at every start
}

func newStartLog() *startLog {
	return &startLog{started: map[int64]time.Time{}, changed: make(chan struct{})}
}

func (s *startLog) Execute(_ context.Context, job *executors.Job) error {
	now := time.Now()
	s.mu.Lock()
	s.started[job.ID] = now
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// wait blocks until every job in ids has started, and returns their start
// times, or fails after timeout.
func (s *startLog) wait(ids []int64, timeout time.Duration) ([]time.Time, error) {
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		times := make([]time.Time, 0, len(ids))
		for _, id := range ids {
			if at, ok := s.started[id]; ok {
				times = append(times, at)
			}
		}
		changed := s.changed
		s.mu.Unlock()
		if len(times) == len(ids) {
			return times, nil
		}
		select {
		case <-changed:
		case <-deadline:
			return nil, fmt.Errorf("jobs %v: %d of %d started within %s", ids, len(times), len(ids), timeout)
		}
	}
}

// Issue 5: writers skip NOTIFY while no worker sleeps, and no wake-up is ever
// lost. The claimer sleeps after 2 ms of empty looks and the fallback tick is
// an hour away, so that a lost wake-up shows as a job that never starts.
// Writers in READ COMMITTED and REPEATABLE READ insert single rows, several
// rows at once, and rows by COPY; one keeps its transaction open after its
// insert until the claimer waits for its sleep key behind it (the writer
// took the key shared) or has gone to sleep again (the writer found the key
// taken, and notifies at its commit), and both must happen. In
// each round, every writer writes within 2 ms of the claimer's going to
// sleep, so that writes land while it sleeps, wakes, takes its sleep key
// again, or looks once more. The run goes on until the claimer has slept and
// woken thousands of times.
func TestNoWakeUpLost(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	log := newStartLog()
	b.registry.Register("probe", log)
	cfg := b.config(t, "w")
	cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	w, _, _ := start(t, cfg)
	c := w.Claimer(pgdispatch.DefaultQueue)
	slept := statesOf(w)

	const (
		wantSleeps = 1500
		maxRun     = 3 * time.Minute
		// Far below the hour of the fallback tick; generous for a loaded
		// machine under the race detector.
		bound = 2 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), maxRun)
	defer cancel()

	pool := pgtest.Pool(t)
	// The open writer's two windows, by how often it held its transaction
	// until each: the claimer waited for its key behind the writer, which
	// had taken the key shared; or the claimer went to sleep again, holding
	// the key, before the commit of a writer that found the key taken and
	// notifies at its commit.
	var behind, slumber atomic.Int64
	// keyRequested reports whether the claimer's request for its queue's
	// sleep key waits on the server, behind a writer that holds the key
	// shared.
	keyRequested := func(ctx context.Context) (bool, error) {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var waiting bool
		err := pool.QueryRow(callCtx, `SELECT EXISTS (SELECT FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND mode = 'ExclusiveLock'
			  AND classid = $1::int4::oid AND objid = hashtext($2)::oid AND objsubid = 2
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`,
			migrations.SleepKey(b.schema), pgdispatch.DefaultQueue).Scan(&waiting)
		return waiting, err
	}

	type write func(ctx context.Context, conn *pgx.Conn) ([]int64, error)
	insertOne := "INSERT INTO " + b.jobs + " (kind) VALUES ('probe') RETURNING id"
	insertMany := "INSERT INTO " + b.jobs + " (kind) SELECT 'probe' FROM generate_series(1, 3) RETURNING id"
	inTx := func(iso pgx.TxIsoLevel, body func(tx pgx.Tx) ([]int64, error), hold time.Duration) write {
		return func(ctx context.Context, conn *pgx.Conn) ([]int64, error) {
			tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			// Take the snapshot before the insert, as a real REPEATABLE READ
			// writer that read first would.
			var n int64
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+b.jobs+" WHERE id < 0").Scan(&n); err != nil {
				return nil, err
			}
			sleeps := c.Stats().Sleeps
			ids, err := body(tx)
			if err != nil {
				return nil, err
			}
			if hold > 0 {
				// The scenario itself: a writer that keeps its transaction
				// open after the insert, until the claimer, done with the
				// round's other jobs, waits for its key behind this writer
				// or has gone to sleep again; or for hold at most.
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				end := time.After(hold)
			holding:
				for {
					waiting, err := keyRequested(ctx)
					if err != nil {
						return nil, err
					}
					if waiting {
						behind.Add(1)
						break
					}
					if c.Stats().Sleeps > sleeps {
						slumber.Add(1)
						break
					}
					select {
					case <-tick.C:
					case <-end:
						break holding
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
			}
			return ids, tx.Commit(ctx)
		}
	}
	query := func(sql string) func(tx pgx.Tx) ([]int64, error) {
		return func(tx pgx.Tx) ([]int64, error) {
			rows, _ := tx.Query(ctx, sql)
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		}
	}
	copyRows := func(tx pgx.Tx) ([]int64, error) {
		// COPY returns no ids: tag the rows and read them back.
		tag := fmt.Sprintf("copy-%d", rand.Int64())
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{b.schema, "jobs"}, []string{"kind", "payload"},
			pgx.CopyFromRows([][]any{{"probe", map[string]string{"tag": tag}}, {"probe", map[string]string{"tag": tag}}})); err != nil {
			return nil, err
		}
		rows, _ := tx.Query(ctx, "SELECT id FROM "+b.jobs+" WHERE payload->>'tag' = $1", tag)
		return pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	writers := map[string]write{
		"read committed, one row": func(ctx context.Context, conn *pgx.Conn) ([]int64, error) {
			rows, _ := conn.Query(ctx, insertOne)
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		},
		"read committed, three rows":  inTx(pgx.ReadCommitted, query(insertMany), 0),
		"repeatable read, one row":    inTx(pgx.RepeatableRead, query(insertOne), 0),
		"repeatable read, three rows": inTx(pgx.RepeatableRead, query(insertMany), 0),
		"repeatable read, copy":       inTx(pgx.RepeatableRead, copyRows, 0),
		"read committed, copy":        inTx(pgx.ReadCommitted, copyRows, 0),
		// A job moved from a queue no one serves: the move wakes the sleeper.
		"moved from another queue": func(ctx context.Context, conn *pgx.Conn) ([]int64, error) {
			var id int64
			if err := conn.QueryRow(ctx, "INSERT INTO "+b.jobs+" (kind, queue) VALUES ('probe', 'parked') RETURNING id").Scan(&id); err != nil {
				return nil, err
			}
			_, err := conn.Exec(ctx, "UPDATE "+b.jobs+" SET queue = 'default' WHERE id = $1", id)
			return []int64{id}, err
		},
		// A job that falls due while another transaction holds its row, which
		// then commits without a change that notifies: the claim that skipped
		// it must look again.
		"locked as it falls due": func(ctx context.Context, conn *pgx.Conn) ([]int64, error) {
			var id int64
			if err := conn.QueryRow(ctx, "INSERT INTO "+b.jobs+" (kind, run_at) VALUES ('probe', now() + interval '3 milliseconds') RETURNING id").Scan(&id); err != nil {
				return nil, err
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			if _, err := tx.Exec(ctx, "SELECT FROM "+b.jobs+" WHERE id = $1 FOR UPDATE", id); err != nil {
				return nil, err
			}
			select { // the scenario: the row stays locked as it falls due
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return []int64{id}, tx.Commit(ctx)
		},
	}
	// The writer that keeps its transaction open holds every sleep back
	// until its commit, so it writes only in every 10th round.
	const long = "repeatable read, open until the claimer waits for the key"
	writers[long] = inTx(pgx.RepeatableRead, query(insertOne), 300*time.Millisecond)

	conns := map[string]*pgx.Conn{}
	for name := range writers {
		conns[name] = pgtest.Conn(t)
	}
	var (
		mu     sync.Mutex
		delays []time.Duration
		jobs   int
	)
	// Rounds: once the claimer sleeps, every writer writes after its own
	// jitter and waits for its jobs to start. Nothing else writes until all
	// of them have, so a missed wake-up cannot be rescued by a later writer's
	// NOTIFY: it shows as a job that does not start within the bound.
	for round := 0; c.Stats().Sleeps < wantSleeps; round++ {
		slept.waitAsleep(t, pgdispatch.DefaultQueue)
		g, gctx := errgroup.WithContext(ctx)
		for name, write := range writers {
			if name == long && round%10 != 0 {
				continue
			}
			g.Go(func() error {
				select { // the scenario's jitter, not synchronisation
				case <-time.After(time.Duration(rand.IntN(2000)) * time.Microsecond):
				case <-gctx.Done():
					return gctx.Err()
				}
				ids, err := write(gctx, conns[name])
				committed := time.Now()
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				started, err := log.wait(ids, bound)
				if err != nil {
					return fmt.Errorf("round %d, %s: %w", round, name, err)
				}
				mu.Lock()
				for _, at := range started {
					delays = append(delays, at.Sub(committed))
				}
				jobs += len(ids)
				mu.Unlock()
				return nil
			})
		}
		require.NoError(t, g.Wait())
	}
	stats := c.Stats()
	require.Zero(t, stats.TickHits)
	require.Positive(t, behind.Load(), "the claimer never waited for its key behind the open writer")
	require.Positive(t, slumber.Load(), "the claimer never went to sleep before the open writer's commit")
	slices.Sort(delays)
	t.Logf("%d jobs, %d sleeps, %d notifications; the open writer committed %d times with the claimer waiting for the key behind it, %d times with it asleep; commit to start p50 %s, p99 %s, max %s",
		jobs, stats.Sleeps, w.Listener().Notifications(), behind.Load(), slumber.Load(),
		delays[len(delays)/2], delays[len(delays)*99/100], delays[len(delays)-1])
}

// The sleep key's connection dies while the claimer sleeps. Writers then find
// the key free and skip NOTIFY, so the claimer must notice at once, look at
// the queue, and take the key again.
func TestSleepKeyConnectionLost(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	cfg := b.config(t, "w")
	app := "pgdispatch-" + b.schema
	cfg.ListenConnConfig = pgtest.Pool(t).Config().ConnConfig.Copy()
	cfg.ListenConnConfig.RuntimeParams["application_name"] = app
	w, _, _ := start(t, cfg)
	b.waitAsleep(t, w)

	var terminated bool
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app+"-sleep").Scan(&terminated))
	require.True(t, terminated)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.rec.waitStart(t, id, waitFor)
	b.waitAsleep(t, w)
	require.Zero(t, w.Claimer(pgdispatch.DefaultQueue).Stats().TickHits)
}

// Two workers share a queue. The one that sleeps holding the key stops; the
// other, waiting for the key, takes it over, and writers go on waking it.
func TestPeerTakesOverSleepKey(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	w1, stop1, _ := start(t, b.config(t, "w1"))
	w2, stop2, _ := start(t, b.config(t, "w2"))
	holder, other, stopHolder := w1, w2, stop1
	s1, s2 := statesOf(w1), statesOf(w2)
	deadline := time.After(waitFor)
	for {
		// Taken before the look, so that a change after it is not missed.
		changed1, changed2 := s1.changes(), s2.changes()
		if s1.asleep(pgdispatch.DefaultQueue) || s2.asleep(pgdispatch.DefaultQueue) {
			break
		}
		select {
		case <-changed1:
		case <-changed2:
		case <-deadline:
			t.Fatal("neither worker went to sleep")
		}
	}
	if s2.asleep(pgdispatch.DefaultQueue) {
		holder, other, stopHolder = w2, w1, stop2
	}
	require.False(t, statesOf(other).asleep(pgdispatch.DefaultQueue), "one sleeper holds the key")

	stopHolder()
	require.False(t, statesOf(holder).asleep(pgdispatch.DefaultQueue))
	b.waitAsleep(t, other)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.rec.waitStart(t, id, waitFor)
	require.Equal(t, int64(1), other.Claimer(pgdispatch.DefaultQueue).Stats().Claimed)
}

// The server restarts under a sleeping worker: every connection is cut, the
// sleep key with them. The worker comes back by itself, and a job inserted
// after the restart runs long before the fallback tick.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	poolCfg, err := pgxpool.ParseConfig(cluster.URL())
	require.NoError(t, err)
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "pgdispatch-restart-test"
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pgdispatch.Migrate(ctx, pool, pgdispatch.DefaultSchema))

	b := &bundle{rec: newRecorder(), registry: executors.NewRegistry()}
	b.registry.Register("record", b.rec)
	cfg := b.config(t, "w")
	cfg.Pool, cfg.Schema = pool, pgdispatch.DefaultSchema
	pgdispatch.SetReconnect(&cfg, 50*time.Millisecond, 0)
	w, _, listening := start(t, cfg)
	b.waitAsleep(t, w)

	require.NoError(t, cluster.Restart(ctx))
	restarted := time.Now()
	waitListening(t, listening)
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO pgdispatch.jobs (kind) VALUES ('record') RETURNING id").Scan(&id))
	startedAt := b.rec.waitStart(t, id, waitFor)
	t.Logf("restart to the first job's start: %s", startedAt.Sub(restarted))
	require.Zero(t, w.Claimer(pgdispatch.DefaultQueue).Stats().TickHits)
}

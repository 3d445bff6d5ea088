package claimer

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// waitStatus polls the row of job id until it reads want.
func waitStatus(ctx context.Context, t *testing.T, c *Claimer, jobs string, id int64, want string) {
	t.Helper()
	wait.For(t, 20*time.Second, fmt.Sprintf("job %d to be %s", id, want), func() bool {
		var status string
		require.NoError(t, c.cfg.Pool.QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", id).Scan(&status))
		return status == want
	})
}

// A result that PostgreSQL's jsonb cannot hold (a string with NUL, a lone
// surrogate, a number past numeric's range) is valid JSON to Go. It must
// not make the outcome statement fail: that would keep its job, and every
// outcome batched with it, running for ever.
func TestUnstorableResultDoesNotStickTheBatch(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]any{
		"nul":       map[string]string{"body": "a\x00b"},
		"surrogate": map[string]any{"raw": rawJSON(`"\udc00"`)},
		"number":    map[string]any{"raw": rawJSON(`1e1000000`)},
		"utf8":      map[string]any{"raw": rawJSON("\"\xff\"")},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			registry := executors.NewRegistry()
			registry.Register("noop", executors.Func(func(ctx context.Context, _ *executors.Job) error {
				_ = executors.RecordResult(ctx, v)
				return nil
			}))
			registry.Register("fail", executors.Func(func(ctx context.Context, _ *executors.Job) error {
				_ = executors.RecordResult(ctx, v)
				return executors.Permanent(errFailed)
			}))
			c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry})
			var done, dead int64
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('noop') RETURNING id").Scan(&done))
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('fail') RETURNING id").Scan(&dead))
			runClaimer(ctx, t, c)
			waitStatus(ctx, t, c, jobs, done, "done")
			waitStatus(ctx, t, c, jobs, dead, "dead")
		})
	}
}

type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

var errFailed = errorString("failed")

type errorString string

func (e errorString) Error() string { return string(e) }

// blockingRun is one run of a job under a blocking executor.
type blockingRun struct {
	attempt int
	ctx     context.Context
	finish  chan error
}

func blockingRegistry(starts chan<- blockingRun) *executors.Registry {
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		s := blockingRun{job.Attempt, ctx, make(chan error, 1)}
		starts <- s
		select {
		case err := <-s.finish:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	return registry
}

// reclaim makes job id's row pending again, as the sweeper does when a
// lease is lost or an operator retries a cancelled job, and has c claim it
// again: it returns the second run.
func reclaim(ctx context.Context, t *testing.T, c *Claimer, jobs string, id int64, starts <-chan blockingRun) blockingRun {
	t.Helper()
	_, err := c.cfg.Pool.Exec(ctx, "UPDATE "+jobs+" SET status = 'pending', locked_by = NULL, locked_until = NULL WHERE id = $1", id)
	require.NoError(t, err)
	c.Wake()
	select {
	case r := <-starts:
		return r
	case <-ctx.Done():
		t.Fatal("the job was not claimed again")
		return blockingRun{}
	}
}

func requireEnds(t *testing.T, ctx context.Context, within time.Duration, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(within):
		t.Fatalf("%s: its context did not end within %s", what, within)
	}
}

// A job whose lease was lost and that the same worker claimed again runs
// twice here. The heartbeat renews the row of the second claim: the first
// run is no longer the row's attempt, and must be stopped, not kept.
func TestHeartbeatStopsTheRunOfAnOlderClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	starts := make(chan blockingRun, 4)
	beats := make(chan int64, 100)
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: blockingRegistry(starts), Options: Options{Lease: 3 * time.Second, ShutdownTimeout: time.Second}})
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('noop') RETURNING id").Scan(&id))
	hooked := testhook.With(ctx, &testhook.Hooks{Heartbeat: func(_ string, n int64) {
		select {
		case beats <- n:
		default:
		}
	}})
	stop := runClaimer(hooked, t, c)
	run1 := <-starts
	run2 := reclaim(ctx, t, c, jobs, id, starts)

	requireEnds(t, run1.ctx, 5*time.Second, "the run of the older claim")
	for range 2 { // two more heartbeats leave the second run be
		<-beats
	}
	require.NoError(t, run2.ctx.Err(), "the run of the row's claim was stopped")
	run2.finish <- nil
	waitStatus(ctx, t, c, jobs, id, "done")
	require.NoError(t, stop())
}

// A job cancelled while its notice went astray, then retried and claimed
// again by the same worker: a late notice (or a forged one) must stop the
// first run, whose claim the row no longer carries, and leave the second.
func TestCancelNoticeStopsTheRunOfAnOlderClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	starts := make(chan blockingRun, 4)
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: blockingRegistry(starts), Options: Options{ShutdownTimeout: time.Second}})
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('noop') RETURNING id").Scan(&id))
	stop := runClaimer(ctx, t, c)
	run1 := <-starts
	run2 := reclaim(ctx, t, c, jobs, id, starts)

	require.Equal(t, 2, c.Cancel([]int64{id}))
	requireEnds(t, run1.ctx, 5*time.Second, "the run of the older claim")
	require.NoError(t, run2.ctx.Err(), "the run of the row's claim was stopped")
	run2.finish <- nil
	waitStatus(ctx, t, c, jobs, id, "done")
	require.NoError(t, stop())
}

// The claim commits on the server before its reply reaches the claimer,
// which only then knows its runs: an operator's cancel() of a job it has
// just claimed may be heard in between. The run must still be stopped at
// once, not at the next heartbeat (Lease/3, 10 s by default).
func TestCancelHeardBeforeTheClaimsRunsAreKnown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var delay atomic.Int64
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	dialer := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &slowConn{Conn: conn, delay: &delay}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	started := make(chan context.Context, 1)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(ctx context.Context, _ *executors.Job) error {
		started <- ctx
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return nil
		}
	}))
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	outcomes := make(outcomeObserver, 4)
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pgtest.Pool(t).Config().ConnConfig,
		Queue: "default", WorkerID: "w", Registry: registry, Options: Options{ShutdownTimeout: time.Second},
		Observer: outcomes,
	})
	require.NoError(t, err)
	asleep := make(chan struct{}, 16)
	stop := runClaimer(testhook.With(ctx, &testhook.Hooks{ClaimerState: func(_, _, to string) {
		if to == "asleep" {
			asleep <- struct{}{}
		}
	}}), t, c)
	<-asleep

	delay.Store(int64(time.Second))
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('noop') RETURNING id").Scan(&id))
	c.Wake()
	// The claim has committed on the server: read on a pool of its own, as
	// the claimer's replies are held back.
	pgtest.WaitSQL(t, 20*time.Second, "the claim to commit", "SELECT status = 'running' FROM "+jobs+" WHERE id = $1", id)
	_, err = pgtest.Pool(t).Exec(ctx, "SELECT * FROM "+pgx.Identifier{schema}.Sanitize()+".cancel($1)", id)
	require.NoError(t, err)
	require.Zero(t, c.Cancel([]int64{id}), "the scenario: the notice comes before the claim's reply")
	delay.Store(0)

	// The run is dropped as soon as the claim's reply is in: before its
	// executor starts, or, if the executor has started, by cancelling its
	// context.
	select {
	case runCtx := <-started:
		requireEnds(t, runCtx, 3*time.Second, "the cancelled job's run")
		require.Equal(t, OutcomeCancelled, <-outcomes)
	case o := <-outcomes:
		require.Equal(t, OutcomeCancelled, o, "the run ended without its executor")
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled job's run neither started nor was dropped")
	}
	require.NoError(t, stop())
	var status string
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", id).Scan(&status))
	require.Equal(t, "cancelled", status)
}

// outcomeObserver hears each attempt's outcome.
type outcomeObserver chan Outcome

func (outcomeObserver) JobStarted(*executors.Job) {}

func (o outcomeObserver) JobFinished(_ *executors.Job, outcome Outcome, _ time.Duration) {
	o <- outcome
}

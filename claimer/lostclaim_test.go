package claimer

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// cutConns keeps the connections a pool dials, to cut them all at once.
type cutConns struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *cutConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
	}
	return conn, err
}

// cut closes every connection dialed so far: replies on their way are lost.
func (c *cutConns) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

// A claim whose connection dies after the server committed it, before its
// reply was read: its jobs are running under this worker, and no run of
// its holds them. The claimer gives them back with their attempts
// uncounted, and they run once, long before their leases (an hour) would
// let a sweeper take them and count an attempt that never ran. A job a
// run of this claimer holds, its lease not renewed yet either, and a job
// of another worker, are left alone.
func TestLostClaimReplyGivesItsJobsBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conns := &cutConns{}
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.DialFunc = conns.dial
	admin := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	app := "lostclaim-" + schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()

	var (
		mu   sync.Mutex
		seen = map[int64][]int{} // the attempts each job ran as
	)
	ran := make(chan struct{}, 16)
	held, release := make(chan struct{}), make(chan struct{})
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error {
		mu.Lock()
		seen[job.ID] = append(seen[job.ID], job.Attempt)
		mu.Unlock()
		ran <- struct{}{}
		return nil
	}))
	registry.Register("hold", executors.Func(func(context.Context, *executors.Job) error {
		close(held)
		<-release
		return nil
	}))
	var holdID, otherID int64
	require.NoError(t, admin.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('hold') RETURNING id").Scan(&holdID))
	// Another worker's fresh claim, its lease as long and not renewed yet.
	require.NoError(t, admin.QueryRow(ctx, "INSERT INTO "+jobs+` (kind, status, attempts, locked_by, updated_at, locked_until)
		VALUES ('noop', 'running', 1, 'other', now(), now() + interval '1 hour') RETURNING id`).Scan(&otherID))
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: admin.Config().ConnConfig,
		Queue: "default", WorkerID: "w", Registry: registry, Options: Options{Concurrency: 10, Lease: time.Hour},
	})
	require.NoError(t, err)

	// Armed, the hook waits for the claim to take the noop jobs on the
	// server, and then cuts the connections: the claim committed, and its
	// reply, which the claim loop reads after the hook, is lost. It is armed
	// once the claimer sleeps, so that the claim the test's wake-up makes
	// is the one that takes them.
	var armed, cut atomic.Bool
	asleep := make(chan struct{}, 100)
	hooks := &testhook.Hooks{
		ClaimerState: func(_, _, to string) {
			if to == "asleep" {
				asleep <- struct{}{}
			}
		},
		ClaimSent: func(string) {
			if !armed.Load() {
				return
			}
			armed.Store(false)
			for {
				var running int
				if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE kind = 'noop' AND status = 'running' AND locked_by = 'w'").
					Scan(&running); err != nil {
					return
				}
				if running > 0 {
					cut.Store(true)
					conns.cut()
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Millisecond):
				}
			}
		},
	}
	stop := runClaimer(testhook.With(ctx, hooks), t, c)
	releaseHeld := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseHeld) // before the claimer's stop, should the test fail
	<-held
	for slept := false; !slept; {
		select {
		case <-asleep:
			slept = true
		case <-ctx.Done():
			t.Fatal("the claimer did not go to sleep")
		}
	}
	armed.Store(true)
	start := time.Now()
	ids := insertJobs(ctx, t, admin, jobs, 5)
	c.Wake()
	for range ids {
		select {
		case <-ran:
		case <-time.After(20 * time.Second):
			r, err := admin.Query(ctx, "SELECT format('%s %s attempts=%s locked_by=%s', id, status, attempts, locked_by) FROM "+jobs+" ORDER BY id")
			require.NoError(t, err)
			rows, err := pgx.CollectRows(r, pgx.RowTo[string])
			require.NoError(t, err)
			t.Fatalf("the lost claim's jobs did not all run within 20 s (cut: %v): %q", cut.Load(), rows)
		}
	}
	t.Logf("the lost claim's jobs ran %s after they were written", time.Since(start))
	require.True(t, cut.Load(), "a claim of the jobs had its reply cut")
	var status string
	var attempts int
	require.NoError(t, admin.QueryRow(ctx, "SELECT status, attempts FROM "+jobs+" WHERE id = $1", holdID).Scan(&status, &attempts))
	require.Equal(t, "running", status, "the held job, while its run goes on")
	require.Equal(t, 1, attempts)
	releaseHeld()
	require.NoError(t, stop())

	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Equal(t, []int{1}, seen[id], "job %d ran once, as its first attempt", id)
	}
	var done int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*), sum(attempts) FROM "+jobs+" WHERE id = ANY($1) AND status = 'done'",
		append(ids, holdID)).Scan(&done, &attempts))
	require.Equal(t, len(ids)+1, done, "every job done")
	require.Equal(t, len(ids)+1, attempts, "one attempt counted per job")
	require.NoError(t, admin.QueryRow(ctx, "SELECT status || ' ' || locked_by, attempts FROM "+jobs+" WHERE id = $1", otherID).Scan(&status, &attempts))
	require.Equal(t, "running other", status, "another worker's job")
	require.Equal(t, 1, attempts)
}

package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgbouncertest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/schedule"
)

// A worker that dies or freezes in the middle of a pass, holding a due
// schedule's row, costs no slot while another worker lives: the other one
// finds the row locked, looks again soon rather than at the next slot, and
// fires the slot once the holder is gone. Killed, the holder's session ends
// at once (here pg_terminate_backend; kill -9 closes the socket, which the
// server sees the same way); frozen (a pass stopped mid-transaction, which
// is all the server sees of a SIGSTOPped worker), the pass's own
// idle_in_transaction_session_timeout ends it on the server, behind a
// PgBouncer in transaction mode too, which has no such timeout of its
// own. The slot, an hour's on a controlled clock, gets one job, from the
// healthy worker.
func TestSlotOutlivesAHolderThatDiesOrFreezes(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgtest.URL())
	for _, c := range []struct {
		name          string
		kill, bounced bool
	}{{"killed", true, false}, {"frozen", false, false}, {"frozen behind PgBouncer", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.exec(t, "SELECT "+pgx.Identifier{e.schema, "schedule"}.Sanitize()+"('tick', NULL, 'noop', every => '1 hour')")
			slot := utc("2030-01-01T00:00:00Z")
			e.exec(t, "UPDATE "+e.schedules+" SET next_run_at = $1", slot)
			clock := func() time.Time { return slot.Add(30 * time.Second) }

			// The holder has a pool of its own, whose connection the test
			// kills; the healthy worker uses the shared one.
			url := pgtest.URL()
			if c.bounced {
				url = bouncer.URL() + "&default_query_exec_mode=cache_describe"
			}
			cfg, err := pgxpool.ParseConfig(url)
			require.NoError(t, err)
			cfg.MaxConns = 2
			holderPool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			defer holderPool.Close()
			holder, err := schedule.New(schedule.Config{Pool: holderPool, Schema: e.schema, Now: clock, Logger: zaptest.NewLogger(t).Named("holder")})
			require.NoError(t, err)
			healthy, err := schedule.New(schedule.Config{Pool: pgtest.Pool(t), Schema: e.schema, Now: clock, Logger: zaptest.NewLogger(t).Named("healthy")})
			require.NoError(t, err)

			held, release := make(chan int32, 1), make(chan struct{})
			schedule.SetAfterLock(holder, func(ctx context.Context, tx pgx.Tx) {
				var pid int32
				_ = tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
				held <- pid
				<-release // the worker does nothing more until released
			})
			passErr := make(chan error, 1)
			go func() {
				_, err := holder.Pass(context.Background())
				passErr <- err
			}()
			released := false
			releaseHolder := func() {
				if !released {
					released = true
					close(release)
				}
			}
			runCtx, stopRun := context.WithCancel(context.Background())
			runDone := make(chan error, 1)
			defer func() {
				releaseHolder()
				t.Logf("the holder's pass ended: %v", <-passErr)
				stopRun()
				t.Logf("the healthy worker's run ended: %v", <-runDone)
			}()

			var pid int32
			select {
			case pid = <-held:
			case <-time.After(30 * time.Second):
				t.Fatal("the holder never locked the schedule")
			}
			heldAt := time.Now()
			shared := pgtest.Pool(t)
			go func() { runDone <- healthy.Run(runCtx) }()
			// The healthy worker has looked (a read, then a pass that
			// found the row locked) while the holder held it.
			wait.For(t, 30*time.Second, "healthy.Stats().Passes >= 2", func() bool { return healthy.Stats().Passes >= 2 })
			require.Zero(t, healthy.Stats().Created)

			if c.kill {
				var killed bool
				require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT pg_terminate_backend($1, 30000)", pid).Scan(&killed))
				require.True(t, killed)
				releaseHolder() // what is left of the holder finds its connection gone
			}
			// Frozen, the holder stays stopped until the slot has its job.
			wait.For(t, 30*time.Second, "the slot to get its job", func() bool {
				n, err := count(shared, "SELECT count(*) FROM "+e.jobs)
				return err == nil && n > 0
			})
			t.Logf("the slot's job was created %s after the holder locked it", time.Since(heldAt).Round(time.Millisecond))
			releaseHolder()
			err = <-passErr
			passErr <- err // for the deferred drain
			require.Error(t, err, "the holder's pass cannot commit")
			t.Logf("the holder's pass: %v", err)

			require.Equal(t, []string{"schedule:tick:2030-01-01T00:00:00Z"}, e.keys(t))
			// The job is visible once its pass commits, and the pass counts
			// it after the commit returns.
			wait.For(t, 30*time.Second, "healthy.Stats().Created >= 1", func() bool { return healthy.Stats().Created >= 1 })
			require.EqualValues(t, 1, healthy.Stats().Created)
			require.Zero(t, holder.Stats().Created)
		})
	}
}

// count runs a query of one integer and returns its error: a query that
// fails is tried again.
func count(pool *pgxpool.Pool, sql string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	err := pool.QueryRow(ctx, sql).Scan(&n)
	return n, err
}

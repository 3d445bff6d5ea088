package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
)

// Scenario 8: failover. A primary with a synchronous streaming standby,
// both clusters of the test's own; the workers and the producer know both
// through one multi-host DATABASE_URL with target_session_attrs=read-write.
// Mid-stream the primary crashes (pg_ctl stop -m immediate) and the standby
// is promoted. Every committed job is done, none lost, the jobs in flight at
// the crash run at most once more, and the workers,
// never restarted, find the new primary by themselves: their pools, their
// listeners (one worker's follows DATABASE_URL, the other's its own
// LISTEN_DATABASE_URL, in the URL form) and their sleep keys.
func TestFailover(t *testing.T) {
	skipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, standby := startSyncPair(ctx, t)
	keyValue := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
		primary.Port(), standby.Port())
	urlForm := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())

	s := newScenarioOn(t, "failover", keyValue, []string{primary.LogPath(), standby.LogPath()}, nil)
	s.claimsMayBeLost = true
	s.dumpLogsOnFailure()
	r := newReceiver(t)
	ws := []*worker{
		s.startWorker("failover-1"),
		s.startWorker("failover-2", "DATABASE_URL="+urlForm, "LISTEN_DATABASE_URL="+urlForm),
	}
	for _, w := range ws {
		s.waitListening(w)
	}
	produceCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	p := s.produce(produceCtx, s.name, 5*time.Millisecond, "http_callback", nil, hookPayload(r))

	var before int
	strike(1, streamFor/2, func() {
		before = len(r.deliveries())
		s.fault(func() {
			require.NoError(t, primary.Crash(ctx))
			require.NoError(t, standby.Promote(ctx))
		})
	})
	stop()
	keys := p.wait(t)
	s.drain(90 * time.Second)
	require.Positive(t, before, "nothing was delivered before the primary crashed")
	require.Greater(t, len(r.deliveries()), before, "nothing was delivered after the failover")

	// A job in flight at the crash can run again: its outcome was lost, and
	// it runs once its lease expires; or its claim was lost (a claim commits
	// without waiting for the standby), and it runs under the same attempt
	// number, its first outcome refused. At most every slot of both workers.
	sum := s.verify(keys, r.deliveries(), r.deliveryTimes(), len(ws)*slots)
	t.Logf("failover: %d jobs, %d delivered before the crash, %d duplicates, %d of them after a lost claim",
		sum.jobs, before, sum.duplicates, sum.sameAttempt)
	// Each listener connects again after its backoff (10 s at most), on the
	// new primary.
	for _, w := range ws {
		require.True(t, w.alive(), "worker %s exited: %v", w.id, w.err)
		require.Eventually(t, func() bool { return strings.Count(w.log.String(), `"listening"`) >= 2 },
			30*time.Second, 20*time.Millisecond, "worker %s never listened again after the failover", w.id)
	}
	var listeners int
	require.Eventually(t, func() bool {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := s.pool.QueryRow(callCtx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'pgdispatch-listener' AND query ILIKE 'listen %' AND datname = current_database()`).Scan(&listeners)
		return err == nil && listeners == len(ws)
	}, 10*time.Second, 20*time.Millisecond, "not one listener session a worker on the promoted standby")
	s.checkServing(r, slots)
	s.grepLogs()
}

// startSyncPair starts a primary and a streaming standby of it, and makes
// the standby synchronous: a commit the primary acknowledged is on the
// standby. synchronous_standby_names is set on the primary after the base
// backup, so that the standby, once promoted, waits for no standby of its
// own.
func startSyncPair(ctx context.Context, t *testing.T) (primary, standby *pgcluster.Cluster) {
	t.Helper()
	opts := pgcluster.Options{Settings: []string{"max_connections=100"}}
	primary, err := pgcluster.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, primary.Stop()) })
	standby, err = primary.StartStandby(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, standby.Stop()) })

	conn, err := pgx.Connect(ctx, primary.URL())
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var sync bool
		err := conn.QueryRow(callCtx, "SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'").Scan(&sync)
		return err == nil && sync
	}, time.Minute, 20*time.Millisecond, "the standby never became synchronous")
	return primary, standby
}

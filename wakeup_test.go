package pgdispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
)

// Acceptance 4: after pg_terminate_backend of the listener, a job inserted in
// the gap runs within the reconnect delay, not at the fallback tick.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	app := "pgdispatch-listener-" + b.schema
	cfg.ListenConnConfig = pgtest.Pool(t).Config().ConnConfig.Copy()
	cfg.ListenConnConfig.RuntimeParams["application_name"] = app
	pgdispatch.SetReconnect(&cfg, 200*time.Millisecond, 0)
	w, _, listening := start(t, cfg)
	b.waitAsleep(t, w)

	ctx := context.Background()
	var terminated bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		"SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&terminated))
	require.True(t, terminated)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	inserted := time.Now()
	waitListening(t, listening)
	startedAt := b.rec.waitStart(t, id, 10*time.Second)
	t.Logf("insert during the gap to start: %s", startedAt.Sub(inserted))
	b.watch.Status(t, id, "done", waitFor)
}

// The fallback tick claims jobs whose notification never came, and counts
// the ticks that found work.
func TestFallbackTickFindsMissedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config(t, "w")
	cfg.PollInterval = 300 * time.Millisecond
	w, _, _ := start(t, cfg)

	// A first job, notified, uses up the wake-ups of the worker's start.
	first := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.watch.Status(t, first, "done", waitFor)
	b.waitAsleep(t, w)
	notified := w.Listener().Notifications()
	require.Zero(t, w.Claimer(pgdispatch.DefaultQueue).Stats().TickHits)

	_, err := pgtest.Pool(t).Exec(ctx, "ALTER TABLE "+b.jobs+" DISABLE TRIGGER jobs_notify_insert")
	require.NoError(t, err)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.watch.Status(t, id, "done", waitFor)
	stats := w.Claimer(pgdispatch.DefaultQueue).Stats()
	require.GreaterOrEqual(t, stats.Ticks, int64(1))
	require.Equal(t, int64(1), stats.TickHits)
	require.Equal(t, notified, w.Listener().Notifications(), "the trigger was off: no notification")
}

// Acceptance 7: a job due in 2 s runs at about 2 s, not at the tick.
func TestScheduledJobRunsWhenDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start(t, b.config(t, "w"))
	id := b.insert(t, `INSERT INTO `+b.jobs+` (kind, run_at) VALUES ('record', now() + interval '2 seconds') RETURNING id`)
	committed := time.Now()
	startedAt := b.rec.waitStart(t, id, 10*time.Second)
	took := startedAt.Sub(committed)
	require.Greater(t, took, 1900*time.Millisecond)
	timing.Below(t, "scheduled +2s, started", took, 3500*time.Millisecond)
}

// An operator's UPDATE that makes a job pending and due wakes a worker too.
func TestUpdateToPendingWakesWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _, _ := start(t, b.config(t, "w"))
	id := b.insert(t, `INSERT INTO `+b.jobs+` (kind, status, finished_at) VALUES ('record', 'dead', now()) RETURNING id`)
	b.watch.Status(t, id, "dead", waitFor)
	b.waitAsleep(t, w)
	ctx := context.Background()
	_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+b.jobs+" SET status = 'pending', run_at = now() WHERE id = $1", id)
	require.NoError(t, err)
	b.watch.Status(t, id, "done", waitFor)
}

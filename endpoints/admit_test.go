package endpoints_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// A job that asks for the probe while another job takes it, its statement
// waiting for the row, waits for that probe: for the instant every job
// held by it waits for (a cool-down past the end of the last one, within
// the probe's time, and a second), not for an instant already past, which
// would make it due again at once, and again, until its wait ended.
func TestAdmitWhileAnotherTakesTheProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	br, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	const ep = "http://down:80"
	for range 4 {
		br.Record(ep, true, "HTTP 503 Service Unavailable")
	}
	require.NoError(t, br.Flush(ctx))
	table := pgx.Identifier{b.schema, "endpoints"}.Sanitize()
	// Its cool-down over.
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+table+" SET open_until = now() - interval '1 millisecond' WHERE endpoint = $1", ep)
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))

	// Another worker takes the probe, and has not committed yet.
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "UPDATE "+table+" SET state = 'half_open', probe_until = now() + interval '1 hour' WHERE endpoint = $1", ep)
	require.NoError(t, err)
	admitted := make(chan endpoints.Admission, 1)
	go func() { admitted <- br.Admit(ctx, ep, time.Hour) }()
	pgtest.WaitSQL(t, time.Minute, "the other job's statement waiting for the row",
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%half_open%' AND pid <> pg_backend_pid())")
	require.NoError(t, tx.Commit(ctx))

	a := <-admitted
	require.False(t, a.Probe, "the probe is the other job's")
	var hold time.Time
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT open_until + interval '1 hour' + interval '1 second' FROM "+table+" WHERE endpoint = $1", ep).Scan(&hold))
	require.True(t, hold.Equal(a.Until), "the job waits for the probe's instant, %s, not %s", hold, a.Until)
	require.Equal(t, "half_open", br.State(ep))
}

// A probe that fails opens the endpoint again at least until the jobs that
// waited for the probe are due, so that they wait again until the same
// instant as the jobs held since, and go in their order with them.
func TestFailedProbeHoldsItsWaitersWithTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.cfg.CoolDown = 200 * time.Millisecond
	br, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	other, err := endpoints.New(b.cfg) // another worker's
	require.NoError(t, err)
	const ep = "http://down:80"
	for range 4 {
		br.Record(ep, true, "HTTP 503 Service Unavailable")
	}
	require.NoError(t, br.Flush(ctx))
	table := pgx.Identifier{b.schema, "endpoints"}.Sanitize()
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+table+" SET open_until = now() - interval '1 millisecond' WHERE endpoint = $1", ep)
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	require.NoError(t, other.Load(ctx))

	probe := br.Admit(ctx, ep, time.Minute)
	require.True(t, probe.Probe)
	waiter := other.Admit(ctx, ep, time.Minute)
	require.False(t, waiter.Probe)
	require.False(t, waiter.Until.IsZero(), "the waiter waits for the probe's instant")
	require.NoError(t, br.ProbeDone(ctx, ep, probe, true, "HTTP 503 Service Unavailable"))

	require.NoError(t, other.Load(ctx))
	later := other.Admit(ctx, ep, time.Minute)
	require.Equal(t, "open", other.State(ep))
	require.True(t, later.Until.Equal(waiter.Until), "a job held after the probe failed waits until %s, as the probe's waiter, not %s", waiter.Until, later.Until)
}

// A job waits for the outcome of a probe in flight, for a while; once a
// wait ran out, the next for the same probe returns at once, so that a
// slow probe holds one batch of slots, not one per job of the backlog.
func TestAwaitProbeWaitsOnceForASlowProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	br, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	const ep = "http://down:80"
	for range 4 {
		br.Record(ep, true, "HTTP 503 Service Unavailable")
	}
	require.NoError(t, br.Flush(ctx))
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+pgx.Identifier{b.schema, "endpoints"}.Sanitize()+
		" SET open_until = now() - interval '1 millisecond' WHERE endpoint = $1", ep)
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	probe := br.Admit(ctx, ep, time.Hour)
	require.True(t, probe.Probe)

	require.False(t, br.AwaitProbe(ctx, ep, time.Millisecond), "the probe is in flight")
	done := make(chan bool, 1)
	go func() { done <- br.AwaitProbe(ctx, ep, time.Hour) }()
	select {
	case ok := <-done:
		require.False(t, ok)
	case <-time.After(time.Minute):
		t.Fatal("a job waited again for a probe that a job waited for in vain")
	}
	require.NoError(t, br.ProbeDone(ctx, ep, probe, false, ""))
	require.True(t, br.AwaitProbe(ctx, ep, time.Hour), "the probe succeeded: the endpoint is closed")
}

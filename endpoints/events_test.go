package endpoints_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// observed is a breaker whose log lines are kept.
func observed(t *testing.T, cfg endpoints.Config) (*endpoints.Breaker, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	cfg.Logger = zap.New(core)
	br, err := endpoints.New(cfg)
	require.NoError(t, err)
	return br, logs
}

type eventRow struct {
	Endpoint, Event, Actor string
	Reason, Note           *string
	JobID                  *int64
}

func (b bundle) events(t *testing.T) []eventRow {
	t.Helper()
	rows, _ := pgtest.Pool(t).Query(context.Background(), "SELECT endpoint, event, actor, reason, note, job_id FROM "+
		pgx.Identifier{b.schema, "endpoint_events"}.Sanitize()+" ORDER BY id")
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[eventRow])
	require.NoError(t, err)
	return events
}

// eventLines are the event, level and fields of the log lines of events.
func eventLines(logs *observer.ObservedLogs) []string {
	var out []string
	for _, e := range logs.All() {
		f := e.ContextMap()
		if _, ok := f["event"]; ok {
			out = append(out, e.Level.String()+" "+f["event"].(string)+" by "+f["by"].(string))
		}
	}
	return out
}

func counted(t *testing.T, br *endpoints.Breaker, want string) {
	t.Helper()
	require.NoError(t, testutil.CollectAndCompare(br, strings.NewReader(`
# HELP pgdispatch_endpoint_events_total Events of the endpoints' circuits (opened, closed, disabled, enabled), by event and by whom (breaker or operator), each counted by the one worker that logged it.
# TYPE pgdispatch_endpoint_events_total counter
`+want), "pgdispatch_endpoint_events_total"))
}

// An endpoint that opens, and closes at its probe's success, is an event
// each time, written with the change, with its job when a kind is set; one
// breaker of the two that read them logs and counts each, at Warn when it
// opens and Info when it closes. The reason is the last failure, as
// redacted as the executor gave it.
func TestEventsOpenAndClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.cfg
	cfg.EventKind, cfg.EventQueue, cfg.EventPayload = "tell_ops", "alerts", json.RawMessage(`{"team": "payments"}`)
	br, logs := observed(t, cfg)
	other, otherLogs := observed(t, cfg)
	const down = "http://down:80"

	for range 4 {
		br.Record(down, true, "POST http://down:80/hook: HTTP 503 Service Unavailable")
	}
	require.NoError(t, br.Flush(ctx))
	require.NoError(t, other.Report(ctx))
	require.NoError(t, br.Report(ctx)) // the other took it
	events := b.events(t)
	require.Len(t, events, 1)
	require.Equal(t, []any{down, "opened", "breaker"}, []any{events[0].Endpoint, events[0].Event, events[0].Actor})
	require.Equal(t, "POST http://down:80/hook: HTTP 503 Service Unavailable", *events[0].Reason)
	require.NotNil(t, events[0].JobID)
	require.Equal(t, []string{"warn opened by breaker"}, eventLines(otherLogs))
	require.Empty(t, eventLines(logs))
	counted(t, other, `pgdispatch_endpoint_events_total{by="breaker",event="closed"} 0
pgdispatch_endpoint_events_total{by="breaker",event="disabled"} 0
pgdispatch_endpoint_events_total{by="breaker",event="opened"} 1
pgdispatch_endpoint_events_total{by="operator",event="disabled"} 0
pgdispatch_endpoint_events_total{by="operator",event="enabled"} 0
`)

	// Its job: of the kind, in the queue, the payload with the event in it.
	var (
		kind, queue string
		payload     map[string]any
	)
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT kind, queue, payload FROM "+pgx.Identifier{b.schema, "jobs"}.Sanitize()+
		" WHERE id = $1", *events[0].JobID).Scan(&kind, &queue, &payload))
	require.Equal(t, "tell_ops", kind)
	require.Equal(t, "alerts", queue)
	require.Equal(t, "payments", payload["team"])
	require.Equal(t, down, payload["endpoint"])
	require.Equal(t, "opened", payload["event"])
	require.Equal(t, "breaker", payload["by"])
	require.Equal(t, *events[0].Reason, payload["reason"])
	require.NotEmpty(t, payload["at"])

	// The probe succeeds: closed.
	_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+pgx.Identifier{b.schema, "endpoints"}.Sanitize()+" SET open_until = now()")
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	probe := br.Admit(ctx, down, time.Minute)
	require.True(t, probe.Probe)
	require.NoError(t, br.ProbeDone(ctx, down, probe, false, ""))
	require.NoError(t, br.Report(ctx))
	require.NoError(t, other.Report(ctx))
	events = b.events(t)
	require.Len(t, events, 2)
	require.Equal(t, []any{"closed", "breaker"}, []any{events[1].Event, events[1].Actor})
	require.NotNil(t, events[1].JobID)
	require.Equal(t, []string{"info closed by breaker"}, eventLines(logs))
}

// An endpoint open for longer than DisableAfter is disabled at its next
// failed probe: an event, and no probe goes any more; its jobs are
// refused. A probe that fails before it only opens it again. With
// DisableAfter below 0 it is never disabled.
func TestAutoDisable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name         string
		disableAfter time.Duration
		openedAgo    string
		want         string
	}{
		{"long", time.Hour, "2 hours", "disabled"},
		{"short", time.Hour, "30 minutes", "open"},
		{"never", -1, "1000 hours", "open"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := b.cfg
			cfg.DisableAfter = c.disableAfter
			br, logs := observed(t, cfg)
			const down = "http://down:80"
			_, err := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+pgx.Identifier{b.schema, "endpoints"}.Sanitize()+
				` (endpoint, state, opened_at, open_until, cool_down, reason)
VALUES ($1, 'open', now() - $2::interval, now(), '1 hour', 'HTTP 503')`, down, c.openedAgo)
			require.NoError(t, err)
			require.NoError(t, br.Load(ctx))
			stale, err := endpoints.New(b.cfg) // it reads the endpoint open, and not again
			require.NoError(t, err)
			require.NoError(t, stale.Load(ctx))
			probe := br.Admit(ctx, down, time.Minute)
			require.True(t, probe.Probe)
			require.NoError(t, br.ProbeDone(ctx, down, probe, true, "POST http://down:80/hook: HTTP 503 Service Unavailable"))
			require.NoError(t, br.Report(ctx))
			require.Equal(t, c.want, br.State(down))
			if c.want == "open" {
				require.Empty(t, b.events(t))
				return
			}
			events := b.events(t)
			require.Len(t, events, 1)
			require.Equal(t, []any{"disabled", "breaker", "POST http://down:80/hook: HTTP 503 Service Unavailable"},
				[]any{events[0].Event, events[0].Actor, *events[0].Reason})
			require.Nil(t, events[0].JobID)
			require.Equal(t, []string{"warn disabled by breaker"}, eventLines(logs))
			require.True(t, br.Admit(ctx, down, time.Minute).Disabled)

			// Past its cool-down, another worker takes no probe either.
			_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+pgx.Identifier{b.schema, "endpoints"}.Sanitize()+" SET open_until = now()")
			require.NoError(t, err)
			require.Equal(t, "open", stale.State(down))
			require.True(t, stale.Admit(ctx, down, time.Minute).Disabled)
			require.Equal(t, "disabled", stale.State(down))
			other, err := endpoints.New(b.cfg)
			require.NoError(t, err)
			require.NoError(t, other.Load(ctx))
			require.Equal(t, "disabled", other.State(down))
			require.True(t, other.Admit(ctx, down, time.Minute).Disabled)
			state, _, _, _ := b.state(t, down)
			require.Equal(t, "open", state)
		})
	}
}

// An operator disables an endpoint (with a note) and enables it again,
// by the SQL functions: each is an event by operator that a worker reads,
// logs and counts; the breakers see it disabled, then closed. A second
// disable or an enable of what is not disabled changes nothing and says
// so; what is not an endpoint is refused.
func TestOperatorDisableEnable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	br, logs := observed(t, b.cfg)
	pool := pgtest.Pool(t)
	call := func(sql string, args ...any) bool {
		t.Helper()
		var changed bool
		require.NoError(t, pool.QueryRow(ctx, strings.ReplaceAll(sql, "{schema}", pgx.Identifier{b.schema}.Sanitize()), args...).Scan(&changed))
		return changed
	}
	const ep = "https://hooks.example.com:443"
	require.True(t, call(`SELECT {schema}.disable_endpoint($1, note => 'receiver migrating, ask ops', event_kind => 'tell_ops')`, ep))
	require.False(t, call(`SELECT {schema}.disable_endpoint($1)`, ep))
	require.NoError(t, br.Load(ctx))
	require.NoError(t, br.Report(ctx))
	require.Equal(t, "disabled", br.State(ep))
	require.True(t, br.Admit(ctx, ep, time.Minute).Disabled)
	// A disabled endpoint does not open, whatever its failures.
	for range 4 {
		br.Record(ep, true, "HTTP 503")
	}
	require.NoError(t, br.Flush(ctx))
	state, _, _, _ := b.state(t, ep)
	require.Equal(t, "closed", state)

	require.True(t, call(`SELECT {schema}.enable_endpoint($1)`, ep))
	require.False(t, call(`SELECT {schema}.enable_endpoint($1)`, ep))
	require.NoError(t, br.Load(ctx))
	require.NoError(t, br.Report(ctx))
	require.Equal(t, "closed", br.State(ep))
	require.Equal(t, endpoints.Admission{}, br.Admit(ctx, ep, time.Minute))

	events := b.events(t)
	require.Len(t, events, 2)
	require.Equal(t, []any{"disabled", "operator", "receiver migrating, ask ops"}, []any{events[0].Event, events[0].Actor, *events[0].Note})
	require.NotNil(t, events[0].JobID)
	require.Equal(t, []any{"enabled", "operator"}, []any{events[1].Event, events[1].Actor})
	require.Nil(t, events[1].JobID)
	require.Equal(t, []string{"warn disabled by operator", "info enabled by operator"}, eventLines(logs))
	counted(t, br, `pgdispatch_endpoint_events_total{by="breaker",event="closed"} 0
pgdispatch_endpoint_events_total{by="breaker",event="disabled"} 0
pgdispatch_endpoint_events_total{by="breaker",event="opened"} 0
pgdispatch_endpoint_events_total{by="operator",event="disabled"} 1
pgdispatch_endpoint_events_total{by="operator",event="enabled"} 1
`)

	for _, bad := range []string{"https://hooks.example.com/path", "Https://hooks.example.com:443", "hooks.example.com"} {
		_, err := pool.Exec(ctx, "SELECT "+pgx.Identifier{b.schema, "disable_endpoint"}.Sanitize()+"($1)", bad)
		require.ErrorContains(t, err, "not an endpoint", bad)
	}
}

// A job is made dead only by what the table says: a worker that has not
// yet read an operator's enable (its notification is on its way: the
// operator enables, then retries the dead jobs at once, as the error says)
// lets the job go rather than fail it as disabled again.
func TestEnableBeatsAStaleRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	br, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	table := pgx.Identifier{b.schema}.Sanitize()
	const ep = "https://hooks.example.com:443"
	_, err = pgtest.Pool(t).Exec(ctx, "SELECT "+table+".disable_endpoint($1)", ep)
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	require.True(t, br.Admit(ctx, ep, time.Minute).Disabled)

	_, err = pgtest.Pool(t).Exec(ctx, "SELECT "+table+".enable_endpoint($1)", ep)
	require.NoError(t, err)
	require.Equal(t, endpoints.Admission{}, br.Admit(ctx, ep, time.Minute), "a job failed as disabled after the enable")
	require.Equal(t, "closed", br.State(ep))
}

// Workers that report at once log each event once between them.
func TestReportOnceAmongWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 450
	_, err := pgtest.Pool(t).Exec(ctx, "SELECT "+pgx.Identifier{b.schema, "endpoint_event"}.Sanitize()+
		"('https://e' || i || '.example:443', 'opened', 'breaker', NULL, NULL, NULL, NULL, NULL) FROM generate_series(1, $1) i", n)
	require.NoError(t, err)
	type worker struct {
		br   *endpoints.Breaker
		logs *observer.ObservedLogs
	}
	workers := make([]worker, 3)
	for i := range workers {
		workers[i].br, workers[i].logs = observed(t, b.cfg)
	}
	var g errgroup.Group
	for _, w := range workers {
		g.Go(func() error { return w.br.Report(ctx) })
	}
	require.NoError(t, g.Wait())
	seen := map[int64]int{}
	for _, w := range workers {
		for _, e := range w.logs.All() {
			seen[e.ContextMap()["event_id"].(int64)]++
		}
	}
	require.Len(t, seen, n)
	for id, times := range seen {
		require.Equal(t, 1, times, "event %d", id)
	}
}

package pgdispatch_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// alerts is a receiver of the events' jobs: it keeps the data of each
// request.
type alerts struct {
	*httptest.Server
	mu      sync.Mutex
	got     []map[string]any
	changed chan struct{}
}

func newAlerts(t *testing.T) *alerts {
	a := &alerts{changed: make(chan struct{})}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var data map[string]any
		if err := json.NewDecoder(r.Body).Decode(&data); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.got = append(a.got, data)
		close(a.changed)
		a.changed = make(chan struct{})
		a.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(a.Close)
	return a
}

// waitEvent waits for the alert of event, and returns it.
func (a *alerts) waitEvent(t *testing.T, event string) map[string]any {
	t.Helper()
	var found map[string]any
	wait.On(t, time.Minute, "the alert of "+event, func() (bool, <-chan struct{}) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, g := range a.got {
			if g["event"] == event {
				found = g
			}
		}
		return found != nil, a.changed
	})
	return found
}

// A receiver down for longer than DisableAfter: its endpoint opens (an
// event whose http_callback job tells an alerts receiver, a log line at
// Warn), its probes fail, and the first after DisableAfter disables it (an
// event, its alert). Its jobs are then dead, unsent, with a last_error that
// says how to enable the endpoint and retry them; a job enqueued then is
// dead without a request. The operator enables it (an event by operator),
// retries the dead jobs by host and port as the error says, and every job
// is delivered.
func TestBreakerDisablesAfterALongOutage(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	failing, notify := newReceiver(t, true), newAlerts(t)
	core, logs := observer.New(zapcore.InfoLevel)
	_, _ = breakerWorker(t, schema, "events", newOutcomes(), 100*time.Millisecond, func(c *endpoints.Config) {
		c.MaxCoolDown = 100 * time.Millisecond
		c.DisableAfter = time.Second
		c.EventKind = "http_callback"
		c.EventPayload = json.RawMessage(`{"url": "` + notify.URL + `/pgdispatch-events"}`)
		c.Logger = zap.New(core)
	})
	ep := endpointOf(t, failing.URL)

	first := enqueueTo(t, schema, failing.URL, 5)
	opened := notify.waitEvent(t, "opened")
	require.Equal(t, ep, opened["endpoint"])
	require.Equal(t, "breaker", opened["by"])
	require.Contains(t, opened["reason"], "HTTP 503")
	require.NotContains(t, opened["reason"], "s3cret")
	disabled := notify.waitEvent(t, "disabled")
	require.Equal(t, ep, disabled["endpoint"])

	later := enqueueTo(t, schema, failing.URL, 3)
	all := append(append([]int64{}, first...), later...)
	pgtest.WaitSQL(t, time.Minute, "every job to the disabled endpoint dead",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'dead'", all, len(all))
	for _, id := range later {
		require.Zero(t, failing.requests(id), "job %d sent to a disabled endpoint", id)
	}
	host := strings.TrimPrefix(ep, "http://")
	var lastError string
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT last_error FROM "+jobs+" WHERE id = $1", later[0]).Scan(&lastError))
	require.Contains(t, lastError, "endpoint "+ep+" is disabled")
	require.Contains(t, lastError, "pgdispatch endpoints enable "+ep)
	require.Contains(t, lastError, "pgdispatch jobs retry --all-dead --host "+host)

	failing.down.Store(false)
	ctx := context.Background()
	a := admin.New(pgtest.Pool(t), schema, 10*time.Second)
	enabled, err := a.EnableEndpoint(ctx, ep, admin.EventJob{})
	require.NoError(t, err)
	require.True(t, enabled)
	n, err := a.RetryDeadMatching(ctx, admin.DeadFilter{Host: host})
	require.NoError(t, err)
	require.EqualValues(t, len(all), n)
	pgtest.WaitSQL(t, time.Minute, "every job delivered once enabled",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'done'", all, len(all))

	// The log: one line per event, at Warn for opened and disabled, Info
	// for enabled, with no secret.
	require.Eventually(t, func() bool { return logs.FilterField(zap.String("event", "enabled")).Len() == 1 },
		time.Minute, 10*time.Millisecond, "the enabled event logged")
	for event, level := range map[string]zapcore.Level{"opened": zap.WarnLevel, "disabled": zap.WarnLevel, "enabled": zap.InfoLevel} {
		lines := logs.FilterField(zap.String("event", event)).All()
		require.Len(t, lines, 1, event)
		require.Equal(t, level, lines[0].Level, event)
	}
	for _, l := range logs.All() {
		require.NotContains(t, l.Message+" "+strings.Join(fieldValues(l), " "), "s3cret")
	}
}

func fieldValues(e observer.LoggedEntry) []string {
	var out []string
	for _, v := range e.ContextMap() {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

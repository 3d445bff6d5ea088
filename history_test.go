package pgdispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// Acceptance 1: a receiver answers 500, then 503, then 200. The job ends
// done; its errors hold the two failures with their statuses, the body's
// first bytes and timings, and its result the 200.
func TestHistoryOfAnHTTPJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	registerHTTP(t, b)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "upstream exploded")
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "try later")
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	defer srv.Close()
	cfg := b.config(t, "w1")
	cfg.RetryBackoff = func(int) time.Duration { return 10 * time.Millisecond }
	start(t, cfg)

	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind, payload) VALUES ('http_callback', $1) RETURNING id",
		fmt.Sprintf(`{"url": %q}`, srv.URL))
	b.watch.Status(t, id, "done", waitFor)

	j, err := admin.New(pgtest.Pool(t), b.schema, 0).Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, int32(3), j.Attempts)
	entries, skipped := j.History()
	require.Zero(t, skipped)
	require.Len(t, entries, 2, "errors: %s", j.Errors)
	for i, want := range []struct {
		status int
		body   string
	}{{500, "upstream exploded"}, {503, "try later"}} {
		e := entries[i]
		require.Equal(t, i+1, e.Attempt)
		require.Equal(t, "w1", e.Worker)
		require.Contains(t, e.Error, fmt.Sprint(want.status))
		require.NotNil(t, e.StartedAt)
		require.NotNil(t, e.FinishedAt)
		require.False(t, e.FinishedAt.Before(*e.StartedAt))
		var res struct {
			Status     int      `json:"status"`
			DurationMS *float64 `json:"duration_ms"`
			Body       string   `json:"body"`
		}
		require.NoError(t, json.Unmarshal(e.Result, &res), "entry %d: %s", i+1, e.Result)
		require.Equal(t, want.status, res.Status)
		require.Equal(t, want.body, res.Body)
		require.NotNil(t, res.DurationMS)
	}
	var res struct {
		Status int `json:"status"`
	}
	require.NoError(t, json.Unmarshal(j.Result, &res), "result: %s", j.Result)
	require.Equal(t, 200, res.Status)
}

// A job retried many times keeps its last 20 failures, and a row whose
// errors a writer set to something else still gets its entries.
func TestHistoryIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w1")
	cfg.RetryBackoff = func(int) time.Duration { return 0 }
	start(t, cfg)
	id := b.insert(t, "INSERT INTO "+b.jobs+` (kind, payload, max_attempts, errors) VALUES ('record', '{"fail": 25}', 25, '{"not": "a list"}') RETURNING id`)
	b.watch.Status(t, id, "dead", waitFor)
	j, err := admin.New(pgtest.Pool(t), b.schema, 0).Get(context.Background(), id)
	require.NoError(t, err)
	entries, _ := j.History()
	require.Len(t, entries, 20)
	for i, e := range entries {
		require.Equal(t, 6+i, e.Attempt)
	}
}

// A custom executor's result is stored on the done job, and a job that
// succeeds at once gets no errors.
func TestCustomResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.registry.Register("answer", executors.Func(func(ctx context.Context, job *executors.Job) error {
		return executors.RecordResult(ctx, map[string]any{"answer": 42, "job": job.ID})
	}))
	start(t, b.config(t, "w1"))
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('answer') RETURNING id")
	b.watch.Status(t, id, "done", waitFor)
	j, err := admin.New(pgtest.Pool(t), b.schema, 0).Get(context.Background(), id)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"answer": 42, "job": %d}`, id), string(j.Result))
	require.Nil(t, j.Errors)
}

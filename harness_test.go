package pgdispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
)

const (
	hour    = time.Hour
	waitFor = 20 * time.Second
)

// claimerStates follows the states of one worker's claimers through the
// test hooks of the context the worker runs with.
type claimerStates struct {
	mu      sync.Mutex
	state   map[string]string // by queue
	changed chan struct{}     // closed and replaced at every change
}

func newClaimerStates() *claimerStates {
	return &claimerStates{state: map[string]string{}, changed: make(chan struct{})}
}

func (s *claimerStates) hooks() *testhook.Hooks {
	return &testhook.Hooks{ClaimerState: func(queue, _, to string) {
		s.mu.Lock()
		s.state[queue] = to
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}}
}

// changes returns a channel that is closed at the next change of state.
func (s *claimerStates) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// asleep reports whether the claimer of queue sleeps: it holds its sleep
// key and found nothing due, so writers notify.
func (s *claimerStates) asleep(queue string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[queue] == "asleep"
}

// waitAsleep waits until the claimer of queue sleeps.
func (s *claimerStates) waitAsleep(t *testing.T, queue string) {
	t.Helper()
	s.wait(t, queue, "asleep")
}

// wait waits until the claimer of queue is in state want.
func (s *claimerStates) wait(t *testing.T, queue, want string) {
	t.Helper()
	wait.On(t, waitFor, fmt.Sprintf("the claimer of queue %q to be %s", queue, want), func() (bool, <-chan struct{}) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.state[queue] == want, s.changed
	})
}

// states are the claimer states of the workers start ran, by worker.
var states sync.Map

func statesOf(w *pgdispatch.Worker) *claimerStates {
	s, _ := states.Load(w)
	return s.(*claimerStates)
}

type bundle struct {
	schema   string
	jobs     string // quoted jobs table
	registry *executors.Registry
	rec      *recorder
	watch    *pgtest.Watcher
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := setupUnwatched(t)
	b.watch = pgtest.Watch(t, b.schema)
	return b
}

// setupUnwatched is setup without the watcher, whose trigger notifies on
// every change to the jobs table.
func setupUnwatched(t *testing.T) *bundle {
	t.Helper()
	schema := pgtest.Schema(t)
	rec := newRecorder()
	reg := executors.NewRegistry()
	reg.Register("record", rec)
	return &bundle{
		schema:   schema,
		jobs:     pgx.Identifier{schema, "jobs"}.Sanitize(),
		registry: reg,
		rec:      rec,
	}
}

// config is a worker config for the test's schema with the fallback tick at
// an hour, so that nothing the test sees comes from polling.
func (b *bundle) config(t *testing.T, id string) pgdispatch.Config {
	return pgdispatch.Config{
		Pool:     pgtest.Pool(t),
		Schema:   b.schema,
		WorkerID: id,
		Registry: b.registry,
		Options:  claimer.Options{PollInterval: hour},
		Logger:   zaptest.NewLogger(t),
	}
}

// waitAsleep waits until the default queue's claimer of w sleeps, holding its
// sleep key, so that the next write notifies.
func (b *bundle) waitAsleep(t *testing.T, w *pgdispatch.Worker) {
	t.Helper()
	statesOf(w).waitAsleep(t, pgdispatch.DefaultQueue)
}

// start runs a worker until the test ends, once its listener is listening.
// It returns the worker, a graceful stop, and a channel that receives each
// time the listener (re)connects.
func start(t *testing.T, cfg pgdispatch.Config) (w *pgdispatch.Worker, stop func(), listening <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	cfg.OnListen = func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	s := newClaimerStates()
	w, stop = workertest.Run(testhook.With(context.Background(), s.hooks()), t, cfg)
	states.Store(w, s)
	t.Cleanup(func() { stop(); states.Delete(w) })
	waitListening(t, ch)
	return w, stop, ch
}

func waitListening(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatal("listener did not connect")
	}
}

func (b *bundle) insert(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, sql, args...).Scan(&id))
	return id
}

func (b *bundle) row(t *testing.T, id int64) (status string, attempts int, lastError *string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		"SELECT status, attempts, last_error FROM "+b.jobs+" WHERE id = $1", id).Scan(&status, &attempts, &lastError))
	return status, attempts, lastError
}

// recorder is an executor that records each start. Its behaviour per job is
// set by the payload: {"fail": N} fails the first N attempts, {"permanent":
// true} fails permanently, {"block": true} waits for its context.
type recorder struct {
	mu      sync.Mutex
	starts  map[int64]int
	started chan int64
	total   atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{starts: map[int64]int{}, started: make(chan int64, 20000)}
}

func (r *recorder) Execute(ctx context.Context, job *executors.Job) error {
	r.mu.Lock()
	r.starts[job.ID]++
	r.mu.Unlock()
	r.total.Add(1)
	r.started <- job.ID
	var p struct {
		Fail      int  `json:"fail"`
		Permanent bool `json:"permanent"`
		Block     bool `json:"block"`
	}
	if err := json.Unmarshal(job.Payload, &p); err != nil {
		return executors.Permanent(err)
	}
	switch {
	case p.Permanent:
		return executors.Permanentf("refused for good")
	case p.Block:
		<-ctx.Done()
		return context.Cause(ctx)
	case job.Attempt <= p.Fail:
		return fmt.Errorf("failing attempt %d on purpose", job.Attempt)
	}
	return nil
}

func (r *recorder) startsOf(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts[id]
}

// waitStart waits for job id to start and returns when it did.
func (r *recorder) waitStart(t *testing.T, id int64, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case got := <-r.started:
			if got == id {
				return time.Now()
			}
		case <-deadline:
			t.Fatalf("job %d did not start within %s", id, timeout)
		}
	}
}

// retryDelays are the backoffs job id got at each retry, from the watcher.
func (b *bundle) retryDelays(id int64) []float64 {
	var delays []float64
	for _, h := range b.watch.History(id) {
		if h.Status == "pending" && h.Attempts > 0 {
			delays = append(delays, h.Delay)
		}
	}
	return delays
}

// waitStarts waits until n jobs have started, failing the test after two
// minutes.
func (r *recorder) waitStarts(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for r.total.Load() < n {
		select {
		case <-r.started:
		case <-deadline:
			t.Fatalf("only %d of %d jobs started", r.total.Load(), n)
		}
	}
}

// requireEachOnce checks that n jobs ran, each once.
func (r *recorder) requireEachOnce(t *testing.T, n int) {
	t.Helper()
	require.Equal(t, int64(n), r.total.Load(), "executions")
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, r.starts, n)
	for id, c := range r.starts {
		require.Equal(t, 1, c, "job %d ran %d times", id, c)
	}
}

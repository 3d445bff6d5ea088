package pgdispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

// A live worker's lease is renewed by the heartbeat, so the sweeper never
// takes a long job from it (river issue #1302).
func TestHeartbeatKeepsLongJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slow := executors.Func(func(ctx context.Context, job *executors.Job) error {
		select {
		case <-time.After(2 * time.Second): // the job's work: four leases long
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	b.registry.Register("slow", slow)
	cfg := b.config(t, "w")
	cfg.Lease = 500 * time.Millisecond
	cfg.SweepInterval = 100 * time.Millisecond
	start(t, cfg)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('slow') RETURNING id")
	s := b.watch.Status(t, id, "done", waitFor)
	require.Equal(t, 1, s.Attempts)
	for _, h := range b.watch.History(id)[1:] { // after the insert
		require.NotEqual(t, "pending", h.Status, "the job was never given back: %+v", b.watch.History(id))
	}
}

// An executor's panic fails that job alone; a payload timeout bounds it.
func TestPanicAndTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.registry.Register("panics", executors.Func(func(context.Context, *executors.Job) error { panic("boom") }))
	cfg := b.config(t, "w")
	start(t, cfg)
	panics := b.insert(t, `INSERT INTO `+b.jobs+` (kind, max_attempts) VALUES ('panics', 1) RETURNING id`)
	slow := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload, max_attempts) VALUES ('record', '{"block": true, "timeout": "200ms"}', 1) RETURNING id`)
	badTimeout := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"timeout": "soon"}') RETURNING id`)

	s := b.watch.Status(t, panics, "dead", waitFor)
	require.Contains(t, *s.Error, "executor panicked: boom")
	s = b.watch.Status(t, badTimeout, "dead", waitFor)
	require.Contains(t, *s.Error, "payload.timeout:")
	require.Equal(t, 1, s.Attempts)
	s = b.watch.Status(t, slow, "dead", waitFor)
	require.Contains(t, *s.Error, "timed out after 200ms")
}

// An executor that ignores its context loses its job, not its slot: the job
// is given up on a little after its timeout, and the worker goes on.
func TestExecutorIgnoringCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	returned := make(chan struct{})
	b.registry.Register("stuck", executors.Func(func(context.Context, *executors.Job) error {
		defer close(returned)
		<-release // not ctx.Done()
		return nil
	}))
	cfg := b.config(t, "w")
	cfg.Concurrency = 1
	start(t, cfg)
	stuck := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload, max_attempts) VALUES ('stuck', '{"timeout": "100ms"}', 1) RETURNING id`)
	s := b.watch.Status(t, stuck, "dead", waitFor)
	require.Contains(t, *s.Error, "the executor did not return within 2s of the job's end (timeout 100ms): abandoned")

	// The only slot is free again.
	next := b.insert(t, `INSERT INTO `+b.jobs+` (kind) VALUES ('record') RETURNING id`)
	b.watch.Status(t, next, "done", waitFor)

	// When the executor returns at last, its result changes nothing.
	close(release)
	<-returned
	later := b.insert(t, `INSERT INTO `+b.jobs+` (kind) VALUES ('record') RETURNING id`)
	b.watch.Status(t, later, "done", waitFor)
	status, attempts, lastErr := b.row(t, stuck)
	require.Equal(t, "dead", status)
	require.Equal(t, 1, attempts)
	require.Contains(t, *lastErr, "abandoned")
}

package pgdispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

// At shutdown, a job whose executor ignores the cancellation is given back
// without it, and the worker stops.
func TestShutdownGivesBackIgnoredCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{}, 1)
	b.registry.Register("stuck", executors.Func(func(context.Context, *executors.Job) error {
		started <- struct{}{}
		<-release // not ctx.Done()
		return nil
	}))
	cfg := b.config(t, "w")
	cfg.ShutdownTimeout = 50 * time.Millisecond
	_, stop, _ := start(t, cfg)
	id := b.insert(t, `INSERT INTO `+b.jobs+` (kind) VALUES ('stuck') RETURNING id`)
	<-started
	stop() // returns once the job is given back
	status, attempts, lastError := b.row(t, id)
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts, "the interrupted attempt is given back")
	require.NotNil(t, lastError)
	require.Contains(t, *lastError, "interrupted by worker shutdown: the executor did not return after cancellation")
}

// Graceful shutdown in process: finished jobs are done, a job that outlives
// ShutdownTimeout is back to pending at once with its attempt given back.
func TestShutdownGivesBackUnfinishedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	cfg.ShutdownTimeout = 300 * time.Millisecond
	_, stop, _ := start(t, cfg)
	quick := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	long := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"block": true}') RETURNING id`)
	b.rec.waitStart(t, long, waitFor)
	b.watch.Status(t, quick, "done", waitFor)
	stop()
	status, attempts, lastError := b.row(t, long)
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts)
	require.NotNil(t, lastError)
	require.Contains(t, *lastError, "interrupted by worker shutdown")
}

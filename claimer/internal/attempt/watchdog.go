package attempt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

const (
	// AbandonGrace is how long an executor has to return, past its job's
	// deadline or its run's stop, before its job is given up on without it.
	AbandonGrace = 2 * time.Second
	// watchdogInterval is how often the watchdog looks for executors that
	// outlived their jobs. It sends nothing to the database.
	watchdogInterval = 500 * time.Millisecond
)

// Watch gives up, until ctx ends, on the runs whose executors have not
// returned AbandonGrace after their deadline: an executor that ignores its
// context must not hold the job and its slot for ever (the heartbeat would
// keep the lease). A stopped run gets the same grace from its stop: its
// outcome is dropped, and its slot is free again. workCtx is the jobs'.
func (a *Attempts) Watch(ctx, workCtx context.Context) {
	t := time.NewTicker(watchdogInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		late, stopped := a.cfg.Runs.Overdue(time.Now(), AbandonGrace)
		for _, r := range late {
			a.abandon(r, fmt.Errorf("the executor did not return within %s of the job's end (timeout %s): abandoned", AbandonGrace, r.Job.Timeout),
				workCtx.Err() != nil)
		}
		for _, r := range stopped {
			a.abandon(r, errors.New("the executor did not return after its job was cancelled: abandoned"), false)
		}
	}
}

// AbandonAll gives up on every run whose executor has not returned after
// the hard stop cancelled it: each is given back, or counted if it ran
// longer than JobTimeout.
func (a *Attempts) AbandonAll() {
	for _, r := range a.cfg.Runs.Unreported() {
		a.abandon(r, errors.New("the executor did not return after cancellation"), true)
	}
}

// abandon reports an outcome for r, whose executor has not returned:
// decided from err, and interrupted by the hard stop when interrupted. The
// slot is free again, the executor's goroutine is left to finish or not,
// and its result is dropped.
func (a *Attempts) abandon(r *runstate.Run, err error, interrupted bool) {
	a.report(r, Ending{
		Err: err, Stopped: a.cfg.Runs.Stopped(r), Interrupted: interrupted, Ran: r.Ran(),
		Attempt: r.Job.Attempt, MaxAttempts: r.Job.MaxAttempts,
	})
}

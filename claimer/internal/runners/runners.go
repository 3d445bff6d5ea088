// Package runners runs a claimer's jobs on goroutines that outlive their
// jobs. A fresh goroutine per job grew its stack anew each time: during a
// drain that was about a quarter of the worker's CPU (pprof:
// runtime.newstack, runtime.copystack). A runner waits Idle for its next
// job, so an idle worker keeps none.
package runners

import (
	"sync"
	"time"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// Idle is how long a runner waits for its next job before it exits.
const Idle = 10 * time.Second

// Runners run the runs they are given with one function.
type Runners struct {
	execute func(*runstate.Run)
	handoff chan *runstate.Run // unbuffered: a send succeeds only to an idle runner
	stop    chan struct{}      // closed by Close
	jobs    sync.WaitGroup
	alive   sync.WaitGroup
}

// New returns Runners that run each run with execute.
func New(execute func(*runstate.Run)) *Runners {
	return &Runners{execute: execute, handoff: make(chan *runstate.Run), stop: make(chan struct{})}
}

// Start runs r on an idle runner, or on a new one.
func (rs *Runners) Start(r *runstate.Run) {
	rs.jobs.Add(1)
	select {
	case rs.handoff <- r:
	default:
		rs.alive.Add(1)
		go rs.serve(r)
	}
}

func (rs *Runners) serve(r *runstate.Run) {
	defer rs.alive.Done()
	// The idle timer is not reset after each job, which cost a lock on the
	// runtime's timer heap per job (pprof during a drain). When it fires,
	// the runner exits only if its last job ended Idle ago, else it waits
	// out the rest.
	idle := time.NewTimer(Idle)
	defer idle.Stop()
	for ok := true; ok; {
		rs.execute(r)
		rs.jobs.Done()
		r, ok = rs.next(idle, time.Now())
	}
}

// next waits for a runner's next job. It reports false when the runner
// should exit: idle since last for Idle, or the runners closed.
func (rs *Runners) next(idle *time.Timer, last time.Time) (*runstate.Run, bool) {
	for {
		select {
		case r := <-rs.handoff:
			return r, true
		case <-idle.C:
			left := Idle - time.Since(last)
			if left <= 0 {
				return nil, false
			}
			idle.Reset(left)
		case <-rs.stop:
			return nil, false
		}
	}
}

// Wait returns a channel closed once every started run has returned.
func (rs *Runners) Wait() <-chan struct{} {
	done := make(chan struct{})
	go func() { rs.jobs.Wait(); close(done) }()
	return done
}

// Close ends the idle runners and, when every run has returned, waits for
// them. A runner whose executor was given up on exits when it returns.
func (rs *Runners) Close(allReturned bool) {
	close(rs.stop)
	if allReturned {
		rs.alive.Wait()
	}
}

package claimer

import (
	"sync"
	"time"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// runnerIdle is how long a runner waits for its next job before it exits.
const runnerIdle = 10 * time.Second

// runners run claimed jobs on goroutines that outlive their jobs. A fresh
// goroutine per job grew its stack anew each time: during a drain that was
// about a quarter of the worker's CPU (pprof: runtime.newstack,
// runtime.copystack). A runner waits runnerIdle for its next job, so an idle
// worker keeps none.
type runners struct {
	execute func(*runstate.Run)
	handoff chan *runstate.Run // unbuffered: a send succeeds only to an idle runner
	stop    chan struct{}      // closed when the claimer stops
	jobs    sync.WaitGroup
	alive   sync.WaitGroup
}

func newRunners(execute func(*runstate.Run)) *runners {
	return &runners{execute: execute, handoff: make(chan *runstate.Run), stop: make(chan struct{})}
}

// start runs r on an idle runner, or on a new one.
func (rs *runners) start(r *runstate.Run) {
	rs.jobs.Add(1)
	select {
	case rs.handoff <- r:
	default:
		rs.alive.Add(1)
		go rs.serve(r)
	}
}

func (rs *runners) serve(r *runstate.Run) {
	defer rs.alive.Done()
	// The idle timer is not reset after each job, which cost a lock on the
	// runtime's timer heap per job (pprof during a drain). When it fires,
	// the runner exits only if its last job ended runnerIdle ago, else it
	// waits out the rest.
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for ok := true; ok; {
		rs.execute(r)
		rs.jobs.Done()
		r, ok = rs.next(idle, time.Now())
	}
}

// next waits for a runner's next job. It reports false when the runner
// should exit: idle since last for runnerIdle, or the claimer stopped.
func (rs *runners) next(idle *time.Timer, last time.Time) (*runstate.Run, bool) {
	for {
		select {
		case r := <-rs.handoff:
			return r, true
		case <-idle.C:
			left := runnerIdle - time.Since(last)
			if left <= 0 {
				return nil, false
			}
			idle.Reset(left)
		case <-rs.stop:
			return nil, false
		}
	}
}

// wait returns a channel closed once every started job has returned.
func (rs *runners) wait() <-chan struct{} {
	done := make(chan struct{})
	go func() { rs.jobs.Wait(); close(done) }()
	return done
}

// close ends the idle runners and, when every job has returned, waits for
// them. A runner whose executor was given up on exits when it returns.
func (rs *runners) close(allReturned bool) {
	close(rs.stop)
	if allReturned {
		rs.alive.Wait()
	}
}

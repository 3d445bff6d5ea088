package claimer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// jobContext is an attempt's context: its parent (the claimer's work
// context) with the attempt's deadline. context.WithDeadline starts a timer
// and registers with its parent as soon as it is made, and stops and
// unregisters when it is cancelled: in a 200,000-job drain of no-op jobs that
// was 11 % of the worker's CPU (pprof: the runtime's timer heap and the
// parent's children map), for jobs that never looked at their context.
// jobContext makes that context only when an executor first asks for Done;
// until then Err answers from the parent and the clock.
type jobContext struct {
	parent   context.Context
	deadline time.Time

	once   sync.Once
	built  atomic.Bool
	ctx    context.Context // set once, before built
	cancel context.CancelFunc
}

func newJobContext(parent context.Context, deadline time.Time) *jobContext {
	return &jobContext{parent: parent, deadline: deadline}
}

func (j *jobContext) build() context.Context {
	j.once.Do(func() {
		j.ctx, j.cancel = context.WithDeadline(j.parent, j.deadline)
		j.built.Store(true)
	})
	return j.ctx
}

func (j *jobContext) Deadline() (time.Time, bool) { return j.deadline, true }

func (j *jobContext) Done() <-chan struct{} { return j.build().Done() }

func (j *jobContext) Err() error {
	if j.built.Load() {
		return j.ctx.Err()
	}
	if err := j.parent.Err(); err != nil {
		return err
	}
	if !time.Now().Before(j.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// Value asks the built context once there is one, so that context.Cause and
// children made with context.WithCancel find its cancellation.
func (j *jobContext) Value(key any) any {
	if j.built.Load() {
		return j.ctx.Value(key)
	}
	return j.parent.Value(key)
}

// release ends the context, as a CancelFunc does, and frees the built
// context's timer, if any. An executor's goroutine that outlives its
// attempt finds the context cancelled.
func (j *jobContext) release() {
	j.once.Do(func() {
		j.ctx, j.cancel = canceled, func() {}
		j.built.Store(true)
	})
	j.cancel()
}

// canceled is the context of an attempt released before anything asked
// for its Done.
var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

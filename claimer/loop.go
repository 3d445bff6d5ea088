package claimer

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runners"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/internal/retry"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
)

// claimLoop runs the machine until ctx ends: it waits for an event, claims
// when the machine says so, starts the claimed jobs, and carries out each
// change of state (the sleep key, the timer).
func (c *Claimer) claimLoop(ctx context.Context, jobs *runners.Runners) {
	c.logger.Info("claimer started", zap.Int("concurrency", c.cfg.Concurrency),
		zap.Duration("poll_interval", c.cfg.PollInterval))
	hooks := testhook.From(ctx)
	c.claimSent, c.claimReturned = hooks.ClaimSent, hooks.ClaimReturned
	tick := time.NewTicker(c.cfg.PollInterval)
	defer tick.Stop()
	m := machine.New()
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := retry.New(c.poolSize)
	for {
		var ev machine.Event
		select {
		case <-ctx.Done():
			c.enter(m.State, machine.StateStopping, hooks)
			return
		case <-c.notified:
			ev = machine.EventWake
		case <-c.sleep.Recheck():
			ev = machine.EventKeyLost
			if c.sleep.Holding() {
				ev = machine.EventKeyGranted
			}
		case <-timer.C:
			ev = machine.EventTimer
		case <-tick.C:
			ev = machine.EventTick
			c.ticks.Add(1)
		case <-c.runs.SlotFreed():
			ev = machine.EventSlotFreed
		}
		from, lean := m.State, m.Lean(ev)
		free := c.runs.Free()
		var runs []*runstate.Run
		if m.Event(ev, free, c.cfg.Concurrency) {
			// Not cut short by ctx: a claim the server committed must reach
			// its jobs, which then go through the shutdown as running ones.
			c.flow.freed = ev == machine.EventSlotFreed
			c.quiet = lean
			var r machine.Result
			r, runs = c.claim(context.WithoutCancel(ctx), free)
			r.At = time.Now()
			if r.Err != nil {
				if ctx.Err() != nil { // a failed claim has no runs
					c.enter(from, machine.StateStopping, hooks)
					return
				}
				r.Delay = failures.Next(r.Err)
				c.logger.Warn("claim failed", zap.Error(r.Err), zap.Int("failures", failures.Failures()),
					zap.Duration("retry_in", r.Delay))
			} else {
				failures = retry.New(c.poolSize)
			}
			if r.Err == nil && r.Paused != c.paused.Load() {
				c.paused.Store(r.Paused)
				if r.Paused {
					c.logger.Info("the queue is paused: no claims until it is resumed")
				} else {
					c.logger.Info("the queue is active again")
				}
			}
			if ev == machine.EventTick && r.Claimed > 0 {
				c.tickHits.Add(1)
				c.logger.Info("fallback tick found due jobs: a notification was missed",
					zap.Int("num_claimed", r.Claimed), zap.Int64("tick_hits", c.tickHits.Load()))
			}
			m.Claimed(ev, r)
		}
		c.enter(from, m.State, hooks)
		// The jobs start after the move, not before: a runner readied last
		// runs first once the loop waits, ahead of the goroutines that
		// giving back the sleep key readies (the context's AfterFunc, the
		// hold's wait).
		start(jobs, runs)
		if m.Rearm { // else the timer runs on: an event that changed nothing must not push it out
			m.Rearm = false
			if m.Timer == machine.NoTimer {
				timer.Stop()
			} else {
				timer.Reset(m.Timer)
			}
		}
	}
}

// enter carries out a move from one state to another: it asks for the
// sleep key or gives it back, and counts the sleeps.
func (c *Claimer) enter(from, to machine.State, hooks *testhook.Hooks) {
	if from == to {
		return
	}
	switch {
	case to.HoldsKey() && !from.HoldsKey():
		c.sleep.Request()
	case !to.HoldsKey() && from.HoldsKey():
		c.sleep.Release()
	}
	if to == machine.StateAsleep {
		c.sleeps.Add(1)
	}
	c.logger.Debug("claimer state", zap.Stringer("from", from), zap.Stringer("to", to))
	if hooks.ClaimerState != nil {
		hooks.ClaimerState(c.cfg.Queue, from.String(), to.String())
	}
}

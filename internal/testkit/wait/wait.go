// Package wait is the tests' one way to wait for a condition: On looks
// again each time an event says it may hold; For, where nothing sends an
// event, looks again every few milliseconds. Either fails the test after
// its timeout, saying what it waited for.
package wait

import (
	"testing"
	"time"
)

// Poll is how often For looks again.
const Poll = 5 * time.Millisecond

// On waits until cond holds, failing the test after timeout. cond reports
// whether it holds and, when it does not, a channel that is ready when it
// may: cond is called again then.
func On[T any](t testing.TB, timeout time.Duration, what string, cond func() (ok bool, changed <-chan T)) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ok, changed := cond()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

// For waits until cond holds, calling it every Poll, failing the test
// after timeout.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(Poll)
	defer tick.Stop()
	On(t, timeout, what, func() (bool, <-chan time.Time) { return cond(), tick.C })
}

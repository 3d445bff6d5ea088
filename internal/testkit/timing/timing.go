// Package timing keeps the tests' wall-clock bounds out of the default run.
//
// A test asserts what happened; how long it took is measured and logged. A
// bound on that figure (a p99 bar, "within 5 s", a slot's lag) flakes on a
// loaded machine, so it is checked only when PGDISPATCH_TIMING=1. A bound
// that only guards against a thing never happening (a 30 s wait for an
// event) is no timing check and stays in the default run.
package timing

import (
	"os"
	"testing"
	"time"
)

// Env is the variable that turns the timing checks on.
const Env = "PGDISPATCH_TIMING"

// Enabled reports whether the timing checks run: PGDISPATCH_TIMING=1.
func Enabled() bool { return os.Getenv(Env) == "1" }

// Require skips the test unless the timing checks run: for a test that
// measures over real time and asserts nothing else.
func Require(t testing.TB) {
	t.Helper()
	if !Enabled() {
		t.Skipf("measures wall-clock time; run it with %s=1", Env)
	}
}

// Below logs what took d and, when the timing checks run, fails the test
// unless d is below bound.
func Below(t testing.TB, what string, d, bound time.Duration) {
	t.Helper()
	t.Logf("%s: %s (bound %s, checked with %s=1)", what, d, bound, Env)
	if Enabled() && d >= bound {
		t.Errorf("%s took %s, not below %s", what, d, bound)
	}
}

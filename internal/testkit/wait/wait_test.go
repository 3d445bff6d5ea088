package wait

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that notes its failure and, as the testing
// package does, ends the goroutine at Fatalf.
type recorder struct {
	testing.TB
	failed chan string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed <- fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a recorder in a goroutine of its own and returns its
// failure, or "".
func run(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t, failed: make(chan string, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	select {
	case msg := <-r.failed:
		return msg
	default:
		return ""
	}
}

func TestOnLooksAgainAtEachEvent(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	changed := make(chan struct{}, 3)
	go func() {
		for range 3 {
			n.Add(1)
			changed <- struct{}{}
		}
	}()
	msg := run(t, func(tb testing.TB) {
		On(tb, time.Minute, "three events", func() (bool, <-chan struct{}) { return n.Load() == 3, changed })
	})
	if msg != "" {
		t.Fatal(msg)
	}
}

func TestForFailsAfterItsTimeout(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	msg := run(t, func(tb testing.TB) {
		For(tb, 50*time.Millisecond, "what never holds", func() bool { calls.Add(1); return false })
	})
	if want := "timed out after 50ms waiting for what never holds"; msg != want {
		t.Fatalf("failure %q, want %q", msg, want)
	}
	if calls.Load() < 2 {
		t.Fatalf("cond was called %d times: For does not poll", calls.Load())
	}
}

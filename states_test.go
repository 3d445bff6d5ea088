package pgdispatch_test

import (
	"sync"
	"testing"
	"time"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
)

// claimerStates follows the states of one worker's claimers through the
// test hooks of the context the worker runs with.
type claimerStates struct {
	mu      sync.Mutex
	state   map[string]string // by queue
	changed chan struct{}     // closed and replaced at every change
}

func newClaimerStates() *claimerStates {
	return &claimerStates{state: map[string]string{}, changed: make(chan struct{})}
}

func (s *claimerStates) hooks() *testhook.Hooks {
	return &testhook.Hooks{ClaimerState: func(queue, _, to string) {
		s.mu.Lock()
		s.state[queue] = to
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}}
}

// changes returns a channel that is closed at the next change of state.
func (s *claimerStates) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// asleep reports whether the claimer of queue sleeps: it holds its sleep
// key and found nothing due, so writers notify.
func (s *claimerStates) asleep(queue string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[queue] == "asleep"
}

// waitAsleep waits until the claimer of queue sleeps.
func (s *claimerStates) waitAsleep(t *testing.T, queue string) {
	t.Helper()
	s.wait(t, queue, "asleep")
}

// wait waits until the claimer of queue is in state want.
func (s *claimerStates) wait(t *testing.T, queue, want string) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		s.mu.Lock()
		state, changed := s.state[queue], s.changed
		s.mu.Unlock()
		if state == want {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("the claimer of queue %q did not reach %q; it is %q", queue, want, state)
		}
	}
}

// states are the claimer states of the workers start ran, by worker.
var states sync.Map

func statesOf(w *pgdispatch.Worker) *claimerStates {
	s, _ := states.Load(w)
	return s.(*claimerStates)
}

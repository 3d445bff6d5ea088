package executors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxResultBytes bounds a result, as JSON.
const MaxResultBytes = 4096

// ErrNoAttempt is returned by RecordResult outside an attempt: ctx does not
// come from a worker (or from WithAttempt).
var ErrNoAttempt = errors.New("executors: the context carries no attempt to record a result in")

// Attempt collects what an executor reports of one attempt besides its
// error. The worker makes one per attempt (WithAttempt) and reads it when
// the executor has returned: a done job keeps the result in its result
// column; a failed attempt's entry in the job's errors holds it.
type Attempt struct {
	mu     sync.Mutex
	result json.RawMessage
	ctx    attemptContext // Context's, kept here so that a worker's attempt allocates no context of its own
}

// attemptContext is a context that carries its Attempt, as
// context.WithValue would.
type attemptContext struct {
	context.Context
	a *Attempt
}

func (c *attemptContext) Value(key any) any {
	if _, ok := key.(attemptKey); ok {
		return c.a
	}
	return c.Context.Value(key)
}

type attemptKey struct{}

// WithAttempt returns a context that carries a new Attempt, and the Attempt.
// Tests of executors call it; workers use Attempt.Context.
func WithAttempt(ctx context.Context) (context.Context, *Attempt) {
	a := &Attempt{}
	return a.Context(ctx), a
}

// Context returns a context that carries a: RecordResult records into it.
// An Attempt carries one context at a time: call it once per attempt.
func (a *Attempt) Context(ctx context.Context) context.Context {
	a.ctx = attemptContext{Context: ctx, a: a}
	return &a.ctx
}

// Result is the last result recorded, or nil.
func (a *Attempt) Result() json.RawMessage {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.result
}

// RecordResult records v, marshalled to JSON, as the result of the attempt
// ctx belongs to, replacing any recorded before. The JSON is made fit for
// PostgreSQL's jsonb: invalid UTF-8, lone surrogates and NUL characters in
// strings become U+FFFD. A result is at most MaxResultBytes; a larger one,
// one that does not marshal, or one with a number whose exponent is past
// ±1000, is refused with an error and the one before is kept. Outside an
// attempt it returns ErrNoAttempt.
//
// The result of an attempt that succeeds is stored on the job for as long
// as done jobs are kept (RETAIN_DONE); that of an attempt that fails goes
// into its entry in the job's errors. Results are shown to operators as
// they are, so record no secret.
func RecordResult(ctx context.Context, v any) error {
	a, ok := ctx.Value(attemptKey{}).(*Attempt)
	if !ok {
		return ErrNoAttempt
	}
	b, err := json.Marshal(v)
	if err == nil && len(b) <= 2*MaxResultBytes { // cleaning shrinks NULs, and grows a byte to 3 at most
		b, err = storable(b)
	}
	if err != nil {
		return fmt.Errorf("executors: result: %w", err)
	}
	if len(b) > MaxResultBytes {
		return fmt.Errorf("executors: result of %d bytes is larger than %d", len(b), MaxResultBytes)
	}
	a.mu.Lock()
	a.result = b
	a.mu.Unlock()
	return nil
}

// maxExponent bounds the exponent of a number in a result: with at most
// MaxResultBytes of digits, it keeps every number within what PostgreSQL's
// numeric holds (131072 digits before the point, 16383 after), where a
// value past it would make the statement that stores the result fail.
const maxExponent = 1000

// storable re-encodes the JSON b so that jsonb accepts it, or says why it
// cannot. MarshalJSON methods and json.RawMessage pass through json.Marshal
// unchecked for UTF-8 and surrogates, and Go strings may hold NUL, which
// jsonb refuses.
func storable(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil { // invalid UTF-8 and lone surrogates decode to U+FFFD
		return nil, err
	}
	v, err := clean(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func clean(v any) (any, error) {
	switch x := v.(type) {
	case string:
		return strings.ReplaceAll(x, "\x00", "\uFFFD"), nil
	case json.Number:
		if i := strings.IndexAny(string(x), "eE"); i >= 0 {
			if e, err := strconv.Atoi(string(x[i+1:])); err != nil || e > maxExponent || e < -maxExponent {
				return nil, fmt.Errorf("the number %.40s… is past what PostgreSQL stores", x)
			}
		}
		return x, nil
	case []any:
		for i := range x {
			var err error
			if x[i], err = clean(x[i]); err != nil {
				return nil, err
			}
		}
		return x, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			e, err := clean(e)
			if err != nil {
				return nil, err
			}
			out[strings.ReplaceAll(k, "\x00", "\uFFFD")] = e
		}
		return out, nil
	}
	return v, nil
}

// SnoozeError asks for the job to run again after Delay, or at Until when
// it is set, without spending an attempt. See Snooze and SnoozeUntil.
type SnoozeError struct {
	Delay time.Duration
	Until time.Time
}

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.Delay) }

// Snooze returns an error that puts the job back to pending, due after d
// (0 when d is negative), and gives back the attempt it was running: its
// attempts count is what it was before the claim, last_error and errors are
// left as they were, and the result is dropped. Use it for "not now", as
// River's JobSnooze; use RetryAfter for a failure that should count.
func Snooze(d time.Duration) error {
	return &SnoozeError{Delay: max(d, 0)}
}

// SnoozeUntil is Snooze until the instant at, as the database's clock
// reads it, d from now as the worker reckons it (for its log): the jobs
// snoozed until one instant are due together, and claimed in their order
// (priority, then id), whenever each was snoozed.
func SnoozeUntil(at time.Time, d time.Duration) error {
	return &SnoozeError{Delay: max(d, 0), Until: at}
}

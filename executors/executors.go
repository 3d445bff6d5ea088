// Package executors defines how a job is run: the Executor interface, the
// errors an executor returns to say what should happen next, and the Registry
// that picks an executor by the job's kind.
//
// An executor returns nil when the job is done. Any other error means retry
// with backoff, unless it is wrapped by Permanent (the job goes dead at once)
// or RetryAfter (the next attempt is at a time the executor chooses).
package executors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Job is what an executor sees of a claimed job.
type Job struct {
	ID          int64
	Queue       string
	Kind        string
	Payload     json.RawMessage
	Priority    int16
	Attempt     int // 1 on the first attempt
	MaxAttempts int
	RunAt       time.Time
	CreatedAt   time.Time
	// Timeout bounds this attempt; the context passed to Execute already
	// carries it as a deadline.
	Timeout time.Duration
}

// Executor runs jobs of one kind. Execute must honour ctx: its deadline is the
// job's timeout, and it is cancelled when the worker stops hard.
type Executor interface {
	Execute(ctx context.Context, job *Job) error
}

// Func adapts a function to Executor.
type Func func(ctx context.Context, job *Job) error

// Execute calls f.
func (f Func) Execute(ctx context.Context, job *Job) error { return f(ctx, job) }

// PermanentError marks a failure that no retry can fix. See Permanent.
// Unsent says the job sent nothing, so that its attempt is given back (see
// Unsent).
type PermanentError struct {
	Err    error
	Unsent bool
}

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the job goes dead at once, without retries.
// A nil err stays nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Unsent wraps err, the failure of a job that was refused before it sent
// anything (its endpoint is disabled), so that the job goes dead at once,
// as with Permanent, its attempt given back: its attempts count only what
// was tried. A nil err stays nil.
func Unsent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err, Unsent: true}
}

// Permanentf is Permanent(fmt.Errorf(format, args...)).
func Permanentf(format string, args ...any) error {
	return Permanent(fmt.Errorf(format, args...))
}

// RetryAfterError asks for the next attempt after Delay. See RetryAfter.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter wraps err so that the next attempt runs after d instead of after
// the worker's backoff. The attempt still counts toward max_attempts.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &RetryAfterError{Delay: max(d, 0), Err: err}
}

// Registry maps kinds to executors. It is safe for concurrent use; executors
// are usually registered before the worker starts.
type Registry struct {
	mu sync.RWMutex
	m  map[string]Executor
}

// NewRegistry returns a registry holding the built-in executors that need no
// configuration: noop.
func NewRegistry() *Registry {
	r := &Registry{m: map[string]Executor{}}
	r.Register(KindNoop, Noop{})
	return r
}

// Register makes e run the jobs of kind, replacing any executor registered
// for it before.
func (r *Registry) Register(kind string, e Executor) {
	if kind == "" || e == nil {
		panic("executors: Register needs a kind and an executor")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]Executor{}
	}
	r.m[kind] = e
}

// Lookup returns the executor for kind.
func (r *Registry) Lookup(kind string) (Executor, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.m[kind]
	return e, ok
}

// NotConfigured stands in for the executor of Kind on a worker that was
// not given its settings: it fails every job, saying which Setting to set.
type NotConfigured struct{ Kind, Setting string }

// Execute implements Executor.
func (n NotConfigured) Execute(context.Context, *Job) error {
	return Permanentf("the %s executor is not configured on this worker: set %s", n.Kind, n.Setting)
}

// Describe lists kinds as r holds them: each one it runs, and each one
// registered NotConfigured, as "kind: set SETTING", in the order of kinds
// and then of the other registered kinds.
func (r *Registry) Describe(kinds ...string) (configured, notConfigured []string) {
	for _, kind := range append(kinds, r.Kinds()...) {
		e, ok := r.Lookup(kind)
		switch nc, missing := e.(NotConfigured); {
		case missing && !slices.Contains(notConfigured, kind+": set "+nc.Setting):
			notConfigured = append(notConfigured, kind+": set "+nc.Setting)
		case ok && !missing && !slices.Contains(configured, kind):
			configured = append(configured, kind)
		}
	}
	return configured, notConfigured
}

// Kinds lists the registered kinds in order.
func (r *Registry) Kinds() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	kinds := make([]string, 0, len(r.m))
	for k := range r.m {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// Redact returns err with every occurrence of secret in its text replaced,
// for errors from libraries or servers that might echo a credential.
// errors.Is and errors.As still see the original.
func Redact(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	return MaskError(err, func(s string) string { return strings.ReplaceAll(s, secret, "xxxxx") })
}

// MaskError returns err with its text passed through mask, for an error
// that may quote what a peer sent (see package redact). errors.Is and
// errors.As still see the original. A nil err stays nil.
func MaskError(err error, mask func(string) string) error {
	if err == nil {
		return nil
	}
	return redactedError{err, mask}
}

type redactedError struct {
	err  error
	mask func(string) string
}

func (r redactedError) Error() string { return r.mask(r.err.Error()) }
func (r redactedError) Unwrap() error { return r.err }

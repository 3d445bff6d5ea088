// Package testhook lets tests, and the bench (cmd/pgdispatch/internal/bench),
// watch the insides of a running worker without any exported API: they put
// Hooks in the context they run the worker with, and the parts that know of
// a hook call it. Otherwise the context holds none and nothing is called.
package testhook

import "context"

// Hooks are the events a test can watch. Each must return quickly and must
// not block, unless it says otherwise: it runs on the goroutine that made
// the event.
type Hooks struct {
	// ClaimerState is called each time the claimer of queue moves from one
	// state to another (claimer's state names: "awake", "saturated",
	// "lingering", "drowsy", "asleep", "backoff", "stopping").
	ClaimerState func(queue, from, to string)
	// Heartbeat is called after each heartbeat of the claimer of queue, with
	// how many leases it renewed.
	Heartbeat func(queue string, renewed int64)
	// ClaimSent is called when a claim of the claimer of queue has been
	// sent, before its reply is read. It may block: the claim waits.
	ClaimSent func(queue string)
	// Notified is called as the listener hears a notification on the
	// jobs' channel, before it wakes the claimer of queue, on the
	// listener's goroutine.
	Notified func(queue string)
	// ClaimReturned is called for each job a claim of the claimer of queue
	// took, once the claim's transaction end has been read, before the job
	// starts, on the claim loop's goroutine.
	ClaimReturned func(queue string, id int64)
	// Looked is called after each look from the front of the claimer of
	// queue (claimer/internal/cursor), with the id of the first due job it
	// found, 0 for none.
	Looked func(queue string, id int64)
}

type key struct{}

// With returns ctx carrying h.
func With(ctx context.Context, h *Hooks) context.Context {
	return context.WithValue(ctx, key{}, h)
}

// From returns the hooks ctx carries, or empty ones.
func From(ctx context.Context) *Hooks {
	if h, ok := ctx.Value(key{}).(*Hooks); ok && h != nil {
		return h
	}
	return &Hooks{}
}

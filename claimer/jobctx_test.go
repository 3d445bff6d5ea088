package claimer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type ctxKey struct{}

// A job's context behaves as context.WithDeadline's would, whether an
// executor asks for Done (which builds that context) or only for Err.
func TestJobContextMeetsItsDeadline(t *testing.T) {
	t.Parallel()
	parent := context.WithValue(context.Background(), ctxKey{}, "v")
	for _, useDone := range []bool{true, false} {
		deadline := time.Now().Add(30 * time.Millisecond)
		ctx := newJobContext(parent, deadline)
		d, ok := ctx.Deadline()
		require.True(t, ok)
		require.Equal(t, deadline, d)
		require.Equal(t, "v", ctx.Value(ctxKey{}))
		require.NoError(t, ctx.Err())
		if useDone {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Done did not close at the deadline")
			}
			require.ErrorIs(t, context.Cause(ctx), context.DeadlineExceeded)
		} else {
			require.Eventually(t, func() bool { return ctx.Err() != nil }, 10*time.Second, time.Millisecond)
		}
		require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded, "useDone %v", useDone)
		require.Equal(t, "v", ctx.Value(ctxKey{}))
		ctx.release()
	}
}

// The parent's cancellation (the hard stop) reaches the job's context, and
// children made from it, as with a context.WithDeadline.
func TestJobContextFollowsItsParent(t *testing.T) {
	t.Parallel()
	for _, buildFirst := range []bool{true, false} {
		parent, cancel := context.WithCancel(context.Background())
		ctx := newJobContext(parent, time.Now().Add(time.Hour))
		var child context.Context
		if buildFirst {
			var stop context.CancelFunc
			child, stop = context.WithCancel(ctx)
			defer stop()
		}
		cancel()
		require.ErrorIs(t, ctx.Err(), context.Canceled, "buildFirst %v", buildFirst)
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done did not close with the parent")
		}
		if child != nil {
			<-child.Done()
			require.ErrorIs(t, child.Err(), context.Canceled)
		}
		ctx.release()
	}
}

// After its attempt, the context is cancelled: an executor's goroutine that
// outlives the attempt sees it end, built or not.
func TestJobContextEndsWithItsAttempt(t *testing.T) {
	t.Parallel()
	for _, buildFirst := range []bool{true, false} {
		ctx := newJobContext(context.Background(), time.Now().Add(time.Hour))
		if buildFirst {
			require.NotNil(t, ctx.Done())
		}
		ctx.release()
		select {
		case <-ctx.Done():
		default:
			t.Fatalf("buildFirst %v: Done is open after release", buildFirst)
		}
		require.ErrorIs(t, ctx.Err(), context.Canceled, "buildFirst %v", buildFirst)
	}
}

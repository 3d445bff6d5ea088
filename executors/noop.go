package executors

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// KindNoop is the kind of the built-in executor that does nothing.
const KindNoop = "noop"

// Noop completes every job at once. With a payload such as {"sleep": "2s"} it
// first waits that long, or until its context ends, which makes it a stand-in
// for real work in benchmarks, demos and tests.
type Noop struct{}

// Execute implements Executor.
func (Noop) Execute(ctx context.Context, job *Job) error {
	d, err := noopSleep(job.Payload)
	if err != nil {
		return Permanent(err)
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("noop: sleep interrupted: %w", context.Cause(ctx))
	}
}

func noopSleep(payload json.RawMessage) (time.Duration, error) {
	d, _, err := PayloadDuration(payload, "sleep")
	return d, err
}

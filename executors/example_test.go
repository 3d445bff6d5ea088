package executors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pgdispatch/pgdispatch/executors"
)

// A program that embeds pgdispatch registers its own kind with one call, and
// tells the worker what a failure means through the error it returns. Pass
// the registry as pgdispatch.Config.Registry.
func ExampleRegistry_Register() {
	registry := executors.NewRegistry()
	registry.Register("resize_image", executors.Func(func(ctx context.Context, job *executors.Job) error {
		var p struct {
			Path  string `json:"path"`
			Width int    `json:"width"`
		}
		if err := json.Unmarshal(job.Payload, &p); err != nil {
			return executors.Permanentf("payload: %w", err) // no retry can fix it
		}
		if p.Width <= 0 {
			return executors.Permanentf("payload.width: must be above 0")
		}
		if p.Path == "busy.png" {
			return executors.RetryAfter(time.Minute, errors.New("file is locked")) // try again in a minute
		}
		fmt.Printf("resizing %s to %d px (attempt %d)\n", p.Path, p.Width, job.Attempt)
		return nil // done
	}))

	exec, _ := registry.Lookup("resize_image")
	err := exec.Execute(context.Background(), &executors.Job{ID: 1, Attempt: 1, Payload: json.RawMessage(`{"path": "cat.png", "width": 640}`)})
	fmt.Println("error:", err)
	err = exec.Execute(context.Background(), &executors.Job{ID: 2, Attempt: 1, Payload: json.RawMessage(`{"path": "cat.png"}`)})
	var permanent *executors.PermanentError
	fmt.Println("permanent:", errors.As(err, &permanent), err)
	fmt.Println(registry.Kinds())
	// Output:
	// resizing cat.png to 640 px (attempt 1)
	// error: <nil>
	// permanent: true payload.width: must be above 0
	// [noop resize_image]
}

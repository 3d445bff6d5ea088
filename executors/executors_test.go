package executors_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

func TestErrorTypes(t *testing.T) {
	t.Parallel()
	base := errors.New("no such mailbox")
	var p *executors.PermanentError
	require.ErrorAs(t, executors.Permanent(base), &p)
	require.ErrorIs(t, executors.Permanent(base), base)
	require.NoError(t, executors.Permanent(nil))

	var r *executors.RetryAfterError
	err := executors.RetryAfter(3*time.Second, base)
	require.ErrorAs(t, err, &r)
	require.Equal(t, 3*time.Second, r.Delay)
	require.ErrorIs(t, err, base)
	require.ErrorAs(t, executors.RetryAfter(-time.Second, nil), &r)
	require.Zero(t, r.Delay)
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	r := executors.NewRegistry()
	_, ok := r.Lookup("noop")
	require.True(t, ok, "noop is built in")
	_, ok = r.Lookup("missing")
	require.False(t, ok)
	r.Register("custom", executors.Func(func(context.Context, *executors.Job) error { return nil }))
	require.Equal(t, []string{"custom", "noop"}, r.Kinds())
	require.Panics(t, func() { r.Register("", executors.Noop{}) })
}

func TestNoopSleepHonoursContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := executors.Noop{}.Execute(ctx, &executors.Job{Payload: json.RawMessage(`{"sleep": "1h"}`)})
	require.ErrorIs(t, err, context.Canceled)

	require.NoError(t, executors.Noop{}.Execute(context.Background(), &executors.Job{Payload: json.RawMessage(`{"sleep": 0.01}`)}))

	var p *executors.PermanentError
	err = executors.Noop{}.Execute(context.Background(), &executors.Job{Payload: json.RawMessage(`{"sleep": "forever"}`)})
	require.ErrorAs(t, err, &p)
	require.Contains(t, err.Error(), "payload.sleep:")
}

func TestPayloadDuration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		payload string
		want    time.Duration
		set     bool
		err     string
	}{
		{`{}`, 0, false, ""},
		{``, 0, false, ""},
		{`[1, 2]`, 0, false, ""},
		{`"timeout"`, 0, false, ""},
		{`{"timeout": null}`, 0, false, ""},
		{`{"timeout": "1.5s"}`, 1500 * time.Millisecond, true, ""},
		{`{"timeout": 2}`, 2 * time.Second, true, ""},
		{`{"timeout": 0.25}`, 250 * time.Millisecond, true, ""},
		{`{"timeout": "-1s"}`, 0, false, "payload.timeout: must not be negative"},
		{`{"timeout": -3}`, 0, false, "payload.timeout: must be a non-negative number of seconds"},
		{`{"timeout": 1e300}`, 0, false, "payload.timeout: must be a non-negative number of seconds"},
		{`{"timeout": true}`, 0, false, "payload.timeout: must be a duration string or a number of seconds"},
		{`{"timeout": "soon"}`, 0, false, `payload.timeout: must be a duration such as "30s"`},
	} {
		d, set, err := executors.PayloadDuration(json.RawMessage(tc.payload), "timeout")
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.payload)
			continue
		}
		require.NoError(t, err, tc.payload)
		require.Equal(t, tc.want, d, tc.payload)
		require.Equal(t, tc.set, set, tc.payload)
	}
}

func FuzzPayloadDuration(f *testing.F) {
	for _, s := range []string{`{"timeout": "1s"}`, `{"timeout": 3}`, `{"timeout": -1}`, `{"timeout": "x"}`, `[]`, `{"timeout": {}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		d, set, err := executors.PayloadDuration(payload, "timeout")
		if err != nil {
			require.False(t, set)
			require.Contains(t, err.Error(), "payload.timeout: ")
			return
		}
		require.GreaterOrEqual(t, d, time.Duration(0))
		if !set {
			require.Zero(t, d)
		}
	})
}

// A registry describes what it runs, the kinds asked for first, and the
// kinds registered NotConfigured with the setting each needs; such a kind's
// jobs fail for good, saying so.
func TestRegistryDescribe(t *testing.T) {
	r := executors.NewRegistry()
	r.Register("http_callback", executors.Noop{})
	r.Register("rabbitmq", executors.NotConfigured{Kind: "rabbitmq", Setting: "RABBITMQ_URL"})
	r.Register("email", executors.NotConfigured{Kind: "email", Setting: "SMTP_HOST"})
	r.Register("custom", executors.Noop{})
	configured, missing := r.Describe("http_callback", "rabbitmq", "email", "absent")
	require.Equal(t, []string{"http_callback", "custom", "noop"}, configured)
	require.Equal(t, []string{"rabbitmq: set RABBITMQ_URL", "email: set SMTP_HOST"}, missing)

	e, _ := r.Lookup("email")
	err := e.Execute(context.Background(), &executors.Job{})
	var permanent *executors.PermanentError
	require.ErrorAs(t, err, &permanent)
	require.EqualError(t, err, "the email executor is not configured on this worker: set SMTP_HOST")
}

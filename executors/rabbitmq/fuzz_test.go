package rabbitmq_test

import (
	"encoding/json"
	"testing"

	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/internal/testkit/payloadcheck"
)

func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"exchange": "", "routing_key": "q", "body": {"a": 1}, "headers": {"h": [1, {"x": null}]}, "content_type": "text/plain"}`,
		`{"routing_key": "q", "body": "raw"}`, `{"body": 1}`, `{"routing_key": 5, "body": 1}`, `{"routing_key": "", "body": 1}`, `null`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if msg := payloadcheck.Check(rabbitmq.Validate(json.RawMessage(payload))); msg != "" {
			t.Fatalf("%s (payload %q)", msg, payload)
		}
	})
}

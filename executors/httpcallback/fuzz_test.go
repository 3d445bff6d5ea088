package httpcallback_test

import (
	"encoding/json"
	"testing"

	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/payloadcheck"
)

func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"url": "http://test.com/", "data": {"param1": "data1"}}`,
		`{"url": "https://x.test/a?b=c", "data": "raw", "method": "put", "headers": {"A": "b"}, "timeout": "2s", "content_type": "text/plain"}`,
		`{"url": 1}`, `{"url": "ftp://x"}`, `[]`, `"x"`, `{"url": "http://x", "headers": {"A\nB": "c"}}`, `{"url": "http://x", "extra": 1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if msg := payloadcheck.Check(httpcallback.Validate(json.RawMessage(payload))); msg != "" {
			t.Fatalf("%s (payload %q)", msg, payload)
		}
	})
}

package email_test

import (
	"encoding/json"
	"testing"

	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/internal/testkit/payloadcheck"
)

func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"to": ["a@b.test"], "subject": "s", "text": "t"}`,
		`{"to": ["A <a@b.test>"], "cc": ["c@d.test"], "bcc": [], "from": "f@g.test", "reply_to": "r@s.test", "subject": "", "html": "<p>", "headers": {"X-A": "b"}}`,
		`{"to": "a@b.test"}`, `{"to": ["nope"], "subject": "s", "text": "t"}`, `{"to": ["a@b.test"], "subject": "a\r\nBcc: x@y"}`, `7`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if msg := payloadcheck.Check(email.Validate(json.RawMessage(payload), "")); msg != "" {
			t.Fatalf("%s (payload %q)", msg, payload)
		}
	})
}

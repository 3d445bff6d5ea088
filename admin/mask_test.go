package admin_test

// What `jobs show`, `jobs list` and the console show of a payload, with
// Job.Mask, holds none of its secrets, whatever shape they are in.

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
)

func TestMaskPayloadShapes(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ payload, secret string }{
		// http_callback sends a JSON string raw: a form body, the usual
		// shape of an OAuth token request.
		"form body": {`{"url":"https://auth.example.com/oauth/token","content_type":"application/x-www-form-urlencoded",` +
			`"data":"grant_type=client_credentials&client_id=app&client_secret=CS-8f2a91c7d3"}`, "CS-8f2a91c7d3"},
		// ... or a JSON document already serialised.
		"JSON body as a string": {`{"url":"https://api.example.com/login","data":"{\"user\":\"bob\",\"password\":\"pw-Zy81x2q\"}"}`, "pw-Zy81x2q"},
		// a credential in a header whose name is not on the list
		"Bearer under another header": {`{"url":"https://api.example.com/x","data":1,"headers":{"X-Upstream":"Bearer tok-55aa77bb99"}}`, "tok-55aa77bb99"},
		// Slack/Discord webhooks: the path is the credential
		// Azure Functions, Datadog: names the list does not know
		"x-functions-key":    {`{"url":"https://fn.example.net/api/h","data":1,"headers":{"x-functions-key":"fk-Q1w2E3r4T5"}}`, "fk-Q1w2E3r4T5"},
		"DD-APPLICATION-KEY": {`{"url":"https://api.datadoghq.com/api/v1/x","data":1,"headers":{"DD-APPLICATION-KEY":"dd-7c1e0b9f"}}`, "dd-7c1e0b9f"},
		"discord webhook":    {`{"url":"https://discord.com/api/webhooks/1234567/DiScOrDtOkEn-42","data":{}}`, "DiScOrDtOkEn-42"},
		"webhook path":       {`{"url":"https://hooks.slack.com/services/T0001/B0001/XoXb9sEcReTwEbHoOkToKeN","data":{"text":"hi"}}`, "XoXb9sEcReTwEbHoOkToKeN"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			j := admin.Job{Payload: []byte(c.payload)}
			j.Mask()
			t.Logf("masked payload: %s", j.Payload)
			require.NotContains(t, string(j.Payload), c.secret)
		})
	}
}

// URLs whose password holds a character that ends the authority ('/', '#',
// '?'), or that have no scheme.
func TestMaskPayloadURLForms(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ payload, secret string }{
		{`{"dsn":"postgres://app:pa/ss-Word9@db.internal:5432/app"}`, "pa/ss-Word9"},
		{`{"dsn":"amqp://app:pa#ss-Word9@mq.internal/vhost"}`, "ss-Word9"},
		{`{"target":"//app:Pw-Word1234@host.example/x"}`, "Pw-Word1234"},
	} {
		t.Run(c.secret, func(t *testing.T) {
			t.Parallel()
			j := admin.Job{Payload: []byte(c.payload)}
			j.Mask()
			t.Logf("masked payload: %s", j.Payload)
			require.NotContains(t, string(j.Payload), c.secret)
		})
	}
}

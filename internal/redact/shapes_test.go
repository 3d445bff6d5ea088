package redact

import (
	"encoding/json"
	"fmt"
	"html"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Header and field names that carry credentials in common APIs are secret
// keys; names that end as they do and are not stay shown.
func TestSecretKeyNames(t *testing.T) {
	t.Parallel()
	for _, k := range []string{
		"authorization", "AUTHORIZATION", "x-api-key", "X-Auth", "X-Auth-Key", "X-Key", "key", "api_key", "sig", "sas",
		"X-Session", "session", "X-Amz-Security-Token", "X-Goog-Api-Key", "client_secret", "X-Vault-Token", "otp", "jwt", "X-JWT-Assertion",
		"X-Hasura-Admin-Secret", "Proxy-Authorization", "DD-APPLICATION-KEY", "X-Algolia-API-Key", "x-functions-key", "access_token",
		"X-Shopify-Access-Token", "Ocp-Apim-Subscription-Key", "X-Postmark-Server-Token", "X-Mailgun-Key",
	} {
		require.True(t, secretKey(k), k)
	}
	for _, k := range []string{"routing_key", "Idempotency-Key", "public_key", "url", "data", "X-Author", "content_type", "monkeys"} {
		require.False(t, secretKey(k), k)
	}
}

// Payload masks a string under any key by what it holds: a form, a
// serialised document, a credential after Bearer, a URL's secrets.
func TestMaskPayloadStrings(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"data":"grant_type=client_credentials&client_id=app&client_secret=CS-8f2a91c7d3"}`:   `{"data":"grant_type=client_credentials&client_id=app&client_secret=xxxxx"}`,
		`{"data":"a=1&client%5Fsecret=s3cr3t-v&b"}`:                                            `{"data":"a=1&client%5Fsecret=xxxxx&b"}`,
		`{"data":"{\"user\":\"bob\",\"password\":\"pw-Zy81x2q\"}"}`:                            `{"data":"{\"user\":\"bob\",\"password\":\"xxxxx\"}"}`,
		`{"data":"[{\"url\":\"https://u:pw@h/\"}]"}`:                                           `{"data":"[{\"url\":\"https://u:xxxxx@h/\"}]"}`,
		`{"headers":{"X-Upstream":"Bearer tok-55aa77bb99","x-functions-key":"fk-Q1w2E3r4T5"}}`: `{"headers":{"X-Upstream":"Bearer xxxxx","x-functions-key":"xxxxx"}}`,
		`{"url":"https://hooks.slack.com/services/T0001/B0001/XoXb9sEcReT?x=1"}`:               `{"url":"https://hooks.slack.com/services/xxxxx/xxxxx/xxxxx?x=xxxxx"}`,
		`{"url":"https://discord.com/api/webhooks/1234567/DiScOrDtOkEn-42"}`:                   `{"url":"https://discord.com/api/webhooks/xxxxx/xxxxx"}`,
		`{"dsn":"postgres://app:pa/ss-Word9@db.internal:5432/app"}`:                            `{"dsn":"postgres://app:xxxxx@db.internal:5432/app"}`,
		`{"dsn":"amqp://app:pa#ss-Word9@mq.internal/vhost"}`:                                   `{"dsn":"amqp://app:xxxxx@mq.internal/vhost"}`,
		`{"target":"//app:Pw-Word1234@host.example/x"}`:                                        `{"target":"//app:xxxxx@host.example/x"}`,
		`{"text":"a plain note = fine, 1+1=2","routing_key":"orders"}`:                         `{"text":"a plain note = fine, 1+1=2","routing_key":"orders"}`,
	} {
		got, err := Payload(json.RawMessage(in))
		require.NoError(t, err, in)
		require.Equal(t, want, string(got), in)
	}
}

// PayloadSecrets finds what Payload masks, and every query value and a
// known webhook's path tokens, which a reply may quote bare.
func TestPayloadSecretsShapes(t *testing.T) {
	t.Parallel()
	got := PayloadSecrets(json.RawMessage(`{"url": "https://maps.test/v1?key=AIzaSyD-0042&sig=a%2Bb",
		"hook": "https://hooks.slack.com/services/T0001/B0001/XoXb9sEcReT", "dsn": "postgres://app:pa/ss-Word9@db/app",
		"data": "grant_type=x&client_secret=CS-8f2a", "body": "{\"password\":\"pw-Zy81\"}",
		"headers": {"X-Upstream": "Bearer tok-55aa", "DD-APPLICATION-KEY": "dd-7c1e"}}`))
	for _, want := range []string{
		"AIzaSyD-0042", "a%2Bb", "a+b", "T0001", "B0001", "XoXb9sEcReT", "pa/ss-Word9", "CS-8f2a",
		"pw-Zy81", "tok-55aa", "dd-7c1e",
	} {
		require.Contains(t, got, want)
	}
	require.NotContains(t, got, "grant_type=x")
}

// A known secret is masked in the forms a peer quotes it in.
func TestSecretsQuotedForms(t *testing.T) {
	t.Parallel()
	const v = `ak&live<2026>"Zq9\/x y;z`
	s := NewSecrets(v)
	marshal := func(v string, escapeHTML bool) string {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(escapeHTML)
		require.NoError(t, enc.Encode(v))
		return strings.TrimSpace(b.String())
	}
	for _, form := range []string{
		marshal(v, true), marshal(v, false), marshal(marshal(v, true), true), marshal(marshal(v, false), false),
		strings.ReplaceAll(marshal(v, true), "/", `\/`), strconv.Quote(v), fmt.Sprintf("%q", marshal(v, true)),
		url.QueryEscape(v), url.PathEscape(v), html.EscapeString(v),
	} {
		out := s.Mask("reply: " + form + " end")
		require.NotContains(t, out, "2026", "%s masked to %s", form, out)
		require.Contains(t, out, Mask)
	}
}

// A secret of 16 bytes or more wrapped over lines is masked but for at most
// 11 bytes at either end of each line.
func TestSecretsWrapped(t *testing.T) {
	t.Parallel()
	const tok = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib2IiLCJyb2xlIjoiYWRtaW4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	s := NewSecrets(tok)
	text := "rejected credentials: Bearer " + tok
	var wrapped strings.Builder
	for ; len(text) > 64; text = text[64:] {
		wrapped.WriteString(text[:64] + "\n")
	}
	wrapped.WriteString(text)
	out := s.Mask(wrapped.String())
	for i := 0; i+12 <= len(tok); i++ {
		require.NotContains(t, out, tok[i:i+12], "%s", out)
	}
	require.Equal(t, "secret-15 b", NewSecrets("short-secret-15").Mask("secret-15 b"), "a value under 16 bytes is masked whole only")
}

// Path masks a known webhook's tokens and segments that look like tokens.
func TestPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[[2]string]string{
		{"127.0.0.1:8080", "/services/T0001/B0001/XoXb9sEcReTwEbHoOkToKeN"}: "/services/T0001/B0001/xxxxx",
		{"hooks.slack.com", "/services/T0001/B0001/XoXb"}:                   "/services/xxxxx/xxxxx/xxxxx",
		{"api.test", "/v1/orders/12345/items"}:                              "/v1/orders/12345/items",
		{"api.test", "/keys/sk_live_4eC39HqLyjWDarjtT1zdp7dc"}:              "/keys/xxxxx",
	} {
		require.Equal(t, want, Path(in[0], in[1]), "%q", in)
	}
}

// A serialised document with nothing to mask is shown as it was written.
func TestMaskPayloadKeepsLayout(t *testing.T) {
	t.Parallel()
	in := `{"data":"{\n  \"order\": 42\n}"}`
	got, err := Payload(json.RawMessage(in))
	require.NoError(t, err)
	require.Equal(t, in, string(got))
}

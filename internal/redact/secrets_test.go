package redact

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A known secret is masked as written, and in base64 wherever it lies in
// the encoded text: alone, after a username as AUTH PLAIN and HTTP Basic
// put it, in either alphabet.
func TestSecretsInBase64(t *testing.T) {
	t.Parallel()
	const pw = "correct-horse>battery?"
	s := NewSecrets(pw, "ab")
	for _, plain := range []string{pw, "\x00mailer\x00" + pw, "u:" + pw, "user:" + pw + ":tail", "xx" + pw} {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
			b64 := enc.EncodeToString([]byte(plain))
			out := s.Mask("535 auth failed: " + b64 + " and " + pw)
			require.NotContains(t, out, pw)
			require.Contains(t, out, Mask)
			// What is left of the encoding stands for at most the bytes
			// around the secret and 2 of its own.
			for i := 0; i+6 <= len(out); i++ {
				require.NotContains(t, b64[len(b64)/2-3:len(b64)/2+3], out[i:i+6], "%q leaves %q", plain, out)
			}
		}
	}
	require.Equal(t, "ab cd", s.Mask("ab cd"), "a value shorter than 4 bytes is not masked")
	require.Equal(t, "the end: xxxxx", s.Mask("the end: correct-ho"), "a secret cut short by the end")
	require.Equal(t, "text", (*Secrets)(nil).Mask("text"))
}

func TestPayloadSecrets(t *testing.T) {
	t.Parallel()
	basic := base64.StdEncoding.EncodeToString([]byte("bob:basic-pw"))
	got := PayloadSecrets(json.RawMessage(`{
		"url": "https://u:url-pw@h.test/x?token=query-tok&page=2", "data": {"n": "plain", "client_secret": 12345678, "list": ["https://tok-user@h.test/"]},
		"headers": {"Authorization": "Bearer bearer-tok", "X-Api-Key": "key-1", "Cookie": "session=sess-1; theme=dark", "Proxy-Authorization": "Basic ` + basic + `", "Accept": "text/html"}}`))
	slices.Sort(got)
	require.ElementsMatch(t, []string{
		"url-pw", "query-tok", "2", "12345678", "tok-user", "Bearer bearer-tok", "bearer-tok", "key-1",
		"session=sess-1; theme=dark", "theme=dark", "sess-1", "dark", "Basic " + basic, basic, "basic-pw",
	}, slices.Compact(got))
	require.Empty(t, PayloadSecrets(json.RawMessage(`{"a": `)), "not JSON")
}

// A reply is masked of the known secrets first, so that a secret with a
// space in it goes whole, then by Text.
func TestReply(t *testing.T) {
	t.Parallel()
	s := NewSecrets("two words")
	require.Equal(t, "<td>xxxxx</td> Authorization: xxxxx xxxxx", Reply("<td>two words</td> Authorization: Bearer abcdef", s))
	require.Equal(t, "535 for AUTH PLAIN xxxxx", Reply("535 for AUTH PLAIN AHVzZXIAcHc=", nil))
	require.Equal(t, "AUTH failed for user", Reply("AUTH failed for user", nil))
}

// Whatever the secret and the bytes around it, its base64 is masked in
// either alphabet, and what is left of the encoding holds at most 2 of its
// bytes on either side.
func FuzzSecretsInBase64(f *testing.F) {
	f.Add("pass", "\x00user\x00", "")
	f.Add("correct horse", "u:", ":x")
	f.Fuzz(func(t *testing.T, secret, before, after string) {
		if len(secret) < minSecret {
			return
		}
		s := NewSecrets(secret)
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			out := s.Mask(enc.EncodeToString([]byte(before + secret + after)))
			require.Contains(t, out, Mask)
			masked := strings.Index(out, Mask)
			// The characters before the mask stand for the bytes before
			// the secret and at most its first 2.
			require.LessOrEqual(t, masked*6/8, len(before)+2, "%q", out)
		}
	})
}

// Every secret PayloadSecrets finds is masked wherever it appears.
func FuzzPayloadSecrets(f *testing.F) {
	f.Add(`{"headers": {"Authorization": "Basic dXNlcjpwYXNzd29yZA==", "Cookie": "a=bcdef; g=hijkl"}, "url": "https://u:pw12@h/?token=abcd"}`)
	f.Fuzz(func(t *testing.T, payload string) {
		secrets := PayloadSecrets(json.RawMessage(payload))
		s := NewSecrets(secrets...)
		for _, secret := range secrets {
			if len(secret) >= minSecret {
				require.NotContains(t, s.Mask("<td>"+secret+"</td>"), secret)
			}
		}
	})
}

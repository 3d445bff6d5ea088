package redact

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMaskURLs(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://bob:pw@host/p?token=t&page=2#x":        "https://bob:xxxxx@host/p?token=xxxxx&page=xxxxx#x",
		"see https://ghp_token@github.test/o/r.git now": "see https://xxxxx@github.test/o/r.git now",
		"amqp://u:p@broker:5672/vh and http://h/?abc":   "amqp://u:xxxxx@broker:5672/vh and http://h/?xxxxx",
		"https://h/cb#access_token=tok&state=s":         "https://h/cb#access_token=xxxxx&state=xxxxx",
		"http://plain.test/path?":                       "http://plain.test/path?",
		"no url here: user:pw@host":                     "no url here: user:pw@host",
	} {
		require.Equal(t, want, URLs(in), "%q", in)
	}
}

func TestMaskPayload(t *testing.T) {
	t.Parallel()
	in := `{"z": 1, "headers": {"X-Api-Key": "k", "Proxy-Authorization": "Basic x", "Accept": "a&b"},
		"a": [{"password": {"deep": ["p", 3, true, null]}}, "https://u:p@h/?q=1"], "n": 1.50, "client_secret": 7}`
	got, err := Payload(json.RawMessage(in))
	require.NoError(t, err)
	//nolint:testifylint // the exact text: key order and number text
	require.Equal(t, `{"z":1,"headers":{"X-Api-Key":"xxxxx","Proxy-Authorization":"xxxxx","Accept":"a&b"},`+
		`"a":[{"password":{"deep":["xxxxx","xxxxx",true,null]}},"https://u:xxxxx@h/?q=xxxxx"],"n":1.50,"client_secret":"xxxxx"}`, string(got),
		"keys keep their order, numbers their text")
	for _, bad := range []string{`{"a": }`, `{"a": 1} {"b": 2}`, `[1,`} {
		_, err := Payload(json.RawMessage(bad))
		require.Error(t, err, bad)
	}
}

func FuzzMaskPayload(f *testing.F) {
	f.Add(`{"Authorization": "Bearer x", "url": "https://u:p@h/?t=1", "n": [1, 2.5e3, "s"]}`)
	f.Add(`"https://a@b"`)
	f.Fuzz(func(t *testing.T, s string) {
		if !json.Valid([]byte(s)) {
			return
		}
		out, err := Payload(json.RawMessage(s))
		require.NoError(t, err, s)
		require.True(t, json.Valid(out), "%s masked to %s", s, out)
		var v any
		require.NoError(t, json.Unmarshal(out, &v))
	})
}

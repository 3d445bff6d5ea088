package httpcallback_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// PayloadURL reads the url as Execute does: the same field, by the same
// matching of JSON keys, and the same rules; it does not read the other
// fields.
func TestPayloadURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		payload, host string // host empty: no url
	}{
		{`{"url": "https://API.example.com:8443/hook?x=1"}`, "API.example.com:8443"},
		{`{"URL": "http://api.example.com/"}`, "api.example.com"},
		{`{"Url": "http://a.example/", "url": "http://b.example/"}`, "b.example"},
		{`{"url": "http://[::1]:9000/"}`, "[::1]:9000"},
		{`{"url": "http://bob:secret@api.example.com/"}`, "api.example.com"},
		{`{"url": "not a url"}`, ""},
		{`{"url": "ftp://api.example.com/"}`, ""},
		{`{"url": "http:///path"}`, ""},
		{`{"url": "http://[::1"}`, ""},
		{`{"url": 5}`, ""},
		{`{"url": null}`, ""},
		{`{}`, ""},
		{`"http://api.example.com/"`, ""},
		{`[]`, ""},
	} {
		u, err := httpcallback.PayloadURL(json.RawMessage(c.payload))
		vErr := httpcallback.Validate(json.RawMessage(c.payload))
		if c.host == "" {
			require.Error(t, err, c.payload)
			require.Error(t, vErr, "Execute refuses it too: %s", c.payload)
			continue
		}
		require.NoError(t, err, c.payload)
		require.Equal(t, c.host, u.Host, c.payload)
		require.NoError(t, vErr, "Execute takes it too: %s", c.payload)
	}
	// The other fields are Execute's to check.
	u, err := httpcallback.PayloadURL(json.RawMessage(`{"url": "https://api.example.com/", "method": 5, "extra": true}`))
	require.NoError(t, err)
	require.Equal(t, "api.example.com", u.Hostname())
}

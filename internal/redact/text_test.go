package redact

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMaskText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"access_token":"eyJhbGci.x-y","expires_in":3600,"password" : 1234}`: `{"access_token":"xxxxx","expires_in":3600,"password" : "xxxxx"}`,
		`{"ok":true,"client_secret":"cut sho`:                                 `{"ok":true,"client_secret":"xxxxx"`,
		`{"note":"see https://bob:pw@host/x?sig=abc"}`:                        `{"note":"see https://bob:xxxxx@host/x?sig=xxxxx"}`,
		"Authorization: Bearer abc.def-ghi\nX-Api-Key: k3y":                   "Authorization: xxxxx xxxxx\nX-Api-Key: xxxxx",
		"access_token=t0k&state=s&password='a b'":                             "access_token=xxxxx&state=s&password=xxxxx",
		`{"error":"invalid","token":"es\"caped"}`:                             `{"error":"invalid","token":"xxxxx"}`,
		"host:8080 status=ok, nothing secret":                                 "host:8080 status=ok, nothing secret",
	} {
		require.Equal(t, want, Text(in), "%q", in)
	}
}

package email_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
)

// Both TLS modes deliver over the executor's own bounded connection, and
// check the server's certificate against Config.TLSConfig.
func TestTLSModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{email.TLSStartTLS, email.TLSImplicit} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s, trust := smtptest.StartTLS(t, user, password, mode == email.TLSImplicit)
			cfg := email.Config{Host: s.Host, Port: s.Port, TLS: mode, TLSConfig: trust, Username: user, Password: password, From: "shop@example.test"}
			got, err := runAttempt(t, cfg, map[string]any{"to": []string{"ann@example.test"}, "subject": "s", "text": "t"})
			require.NoError(t, err)
			require.Contains(t, got, `"smtp_code":250`)
			require.Len(t, s.Messages(), 1)

			cfg.TLSConfig = nil // the system's roots do not know the server's certificate
			_, err = runAttempt(t, cfg, map[string]any{"to": []string{"ann@example.test"}, "subject": "s", "text": "t"})
			require.ErrorContains(t, err, "certificate")
			require.Len(t, s.Messages(), 1)
		})
	}
}

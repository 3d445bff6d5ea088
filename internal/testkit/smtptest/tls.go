package smtptest

import (
	"crypto/tls"
	"testing"

	"github.com/pgdispatch/pgdispatch/internal/testkit/tlstest"
)

// StartTLS runs a server with a certificate of its own for 127.0.0.1 that
// offers STARTTLS, or, when implicit is true, speaks TLS from the first
// byte. It returns the server and the TLS settings that trust it.
func StartTLS(t testing.TB, user, password string, implicit bool) (*Server, *tls.Config) {
	t.Helper()
	certs := tlstest.New(t)
	return start(t, user, password, certs.Server, implicit), certs.Client
}

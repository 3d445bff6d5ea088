package email_test

// An SMTP server whose 535 reply quotes the credentials: AUTH PLAIN's
// over two lines of a multi-line reply, or the password decoded.

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
)

func TestAuthEchoSplitAcrossLines(t *testing.T) {
	t.Parallel()
	authEcho(t, "split", password)
}

// The server quotes the decoded password; textproto.Error writes the reply
// with %q, which escapes a password's quote or backslash.
func TestAuthEchoDecodedQuoted(t *testing.T) {
	t.Parallel()
	authEcho(t, "decoded", `horse"battery\\staple`)
}

func authEcho(t *testing.T, mode, password string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		r := bufio.NewReader(c)
		_, _ = c.Write([]byte("220 mx.example.test ESMTP\r\n"))
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\r\n")
			switch up := strings.ToUpper(line); {
			case strings.HasPrefix(up, "EHLO"), strings.HasPrefix(up, "HELO"):
				_, _ = c.Write([]byte("250-mx.example.test\r\n250 AUTH PLAIN LOGIN\r\n"))
			case strings.HasPrefix(up, "AUTH PLAIN "):
				cred := line[len("AUTH PLAIN "):]
				// a log-style quote, wrapped at 16 columns
				if mode == "split" {
					_, _ = c.Write([]byte("535-5.7.8 authentication failed for AUTH PLAIN " + cred[:16] + "\r\n535 5.7.8 " + cred[16:] + "\r\n"))
				} else {
					d, _ := base64.StdEncoding.DecodeString(cred)
					parts := strings.Split(string(d), "\x00")
					_, _ = c.Write([]byte("535 5.7.8 wrong password " + parts[len(parts)-1] + "\r\n"))
				}
			case up == "QUIT":
				_, _ = c.Write([]byte("221 bye\r\n"))
				return
			default:
				_, _ = c.Write([]byte("502 no\r\n"))
			}
		}
	}()
	_, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)
	e, err := email.New(email.Config{
		Host: "127.0.0.1", Port: port, TLS: email.TLSNone, Username: user, Password: password, AllowPlaintextAuth: true,
		From: "shop@example.test", Timeout: 20 * time.Second,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx, a := executors.WithAttempt(ctx)
	err = e.Execute(ctx, &executors.Job{ID: 3, Attempt: 1, Payload: json.RawMessage(`{"to": ["ann@example.test"], "subject": "s", "text": "t"}`)})
	require.Error(t, err)
	plain := base64.StdEncoding.EncodeToString([]byte("\x00" + user + "\x00" + password))
	t.Logf("the credentials, base64: %s", plain)
	for _, out := range []string{err.Error(), string(a.Result())} {
		t.Log(out)
		if mode == "split" {
			require.NotContains(t, out, plain[16:], "the tail of AUTH PLAIN: the password's last bytes")
		} else {
			require.NotContains(t, out, "staple")
		}
	}
}

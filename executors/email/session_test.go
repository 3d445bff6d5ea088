package email_test

// SMTP servers that fail a session part of the way through, scripted by
// the test over a real TCP listener: what becomes of the job depends on
// what the server said, and when.

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
)

// hangUp, as a script's reply, closes the connection instead of replying;
// stall reads on, and replies to nothing more.
const (
	hangUp = ""
	stall  = "\x00stall"
)

// script is a scripted server's replies by command verb (MAIL, RCPT,
// DATA, RSET, NOOP, QUIT, ...); "." is the reply to the end of the data.
// A verb it does not name gets a plain success, or 502 when the server
// does not know it.
type script map[string]string

var defaultReplies = script{
	"EHLO": "250-mx.example.test\r\n250-8BITMIME\r\n250 ENHANCEDSTATUSCODES",
	"HELO": "250 mx.example.test",
	"MAIL": "250 2.1.0 ok", "RCPT": "250 2.1.5 ok", "DATA": "354 go on", ".": "250 2.0.0 queued as 17",
	"RSET": "250 2.0.0 ok", "NOOP": "250 2.0.0 ok", "QUIT": "221 2.0.0 bye",
}

// scripted is a server for one session, written with no SMTP library.
type scripted struct{ port int }

func startScripted(t *testing.T, replies script) *scripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &scripted{port: ln.Addr().(*net.TCPAddr).Port}
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		s.serve(c, replies)
	}()
	return s
}

func (scripted) serve(c net.Conn, replies script) {
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("220 mx.example.test ESMTP\r\n")); err != nil {
		return
	}
	inData := false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		verb := "."
		switch {
		case inData && line != ".":
			continue
		case !inData:
			verb, _, _ = strings.Cut(strings.ToUpper(line), " ")
		}
		reply, ok := replies[verb]
		if !ok {
			reply, ok = defaultReplies[verb]
		}
		if !ok {
			reply = "502 5.5.2 unknown command"
		}
		switch reply {
		case hangUp:
			return
		case stall:
			_, _ = io.Copy(io.Discard, r)
			return
		}
		if _, err := c.Write([]byte(reply + "\r\n")); err != nil {
			return
		}
		inData = verb == "DATA" && strings.HasPrefix(reply, "354")
		if verb == "QUIT" {
			return
		}
	}
}

// config is the executor's config for s: plain SMTP, no AUTH.
func (s *scripted) config() email.Config {
	return email.Config{Host: "127.0.0.1", Port: s.port, TLS: email.TLSNone, From: "shop@example.test", Password: password}
}

// scriptedAttempt sends one message through s, and returns the result the
// attempt recorded and its error.
func scriptedAttempt(t *testing.T, s *scripted) (string, error) {
	t.Helper()
	return runAttempt(t, s.config(), map[string]any{"to": []string{"ann@example.test"}, "subject": "s", "text": "t"})
}

func isPermanent(err error) bool {
	var p *executors.PermanentError
	return errors.As(err, &p)
}

// A server that closes the connection part of the way through the
// transaction, sends a reply past MaxReplyBytes, or a reply that is no
// refusal (neither 4xx nor 5xx) where another was due, has not refused the
// message: the job retries, as after a connection error at the greeting.
func TestConnectionLostDuringTheTransactionRetries(t *testing.T) {
	t.Parallel()
	endless := "550-" + strings.Repeat("x", 500) + "\r\n"
	for name, replies := range map[string]script{
		"closed at NOOP":                 {"NOOP": hangUp},
		"421 at NOOP":                    {"NOOP": "421 4.3.2 shutting down"},
		"closed at MAIL FROM":            {"MAIL": hangUp},
		"closed at RCPT TO":              {"RCPT": hangUp},
		"closed at DATA":                 {"DATA": hangUp},
		"closed before the data's reply": {".": hangUp},
		"endless reply to RCPT TO":       {"RCPT": strings.Repeat(endless, 2*email.MaxReplyBytes/len(endless))},
		"a 2xx that is not 250 to DATA":  {"DATA": "250 2.0.0 no data needed"},
		"a 1xx reply to the end of data": {".": "150 hold on"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := startScripted(t, replies)
			_, err := scriptedAttempt(t, s)
			t.Log(err)
			require.Error(t, err)
			require.False(t, isPermanent(err), "nothing refused the message: the job retries")
		})
	}
}

// A server that does not reply within Config.Timeout during the
// transaction has not refused the message: the job retries.
func TestTimeoutDuringTheTransactionRetries(t *testing.T) {
	t.Parallel()
	for _, verb := range []string{"MAIL", "RCPT", "DATA", "."} {
		t.Run(verb, func(t *testing.T) {
			t.Parallel()
			s := startScripted(t, script{verb: stall})
			cfg := s.config()
			cfg.Timeout = 100 * time.Millisecond // the job's own deadline is later
			_, err := runAttempt(t, cfg, map[string]any{"to": []string{"ann@example.test"}, "subject": "s", "text": "t"})
			require.ErrorContains(t, err, "i/o timeout")
			require.False(t, isPermanent(err), "the server was slow: the job retries")
		})
	}
}

// The reply that refused the message decides the job, and is the
// attempt's result, whatever the server says to the QUIT that follows it.
func TestTheRefusalDecidesNotTheReplyToQuit(t *testing.T) {
	t.Parallel()
	t.Run("550 then 421 to QUIT", func(t *testing.T) {
		t.Parallel()
		s := startScripted(t, script{"RCPT": "550 5.1.1 no such user", "QUIT": "421 4.7.0 too many errors"})
		got, err := scriptedAttempt(t, s)
		require.ErrorContains(t, err, "550")
		require.True(t, isPermanent(err), "a 5xx is permanent")
		require.JSONEq(t, `{"smtp_code": 550, "enhanced_status": "5.1.1", "command": "RCPT TO", "reply": "5.1.1 no such user"}`, got)
	})
	t.Run("451 then 554 to QUIT", func(t *testing.T) {
		t.Parallel()
		s := startScripted(t, script{"RCPT": "451 4.3.0 try later", "QUIT": "554 5.5.1 no"})
		got, err := scriptedAttempt(t, s)
		require.ErrorContains(t, err, "451")
		require.False(t, isPermanent(err), "a 4xx retries")
		require.JSONEq(t, `{"smtp_code": 451, "enhanced_status": "4.3.0", "command": "RCPT TO", "reply": "4.3.0 try later"}`, got)
	})
	t.Run("no refusal, then 421 to QUIT", func(t *testing.T) {
		t.Parallel()
		s := startScripted(t, script{"DATA": "250 2.0.0 no data needed", "QUIT": "421 4.7.0 bye"})
		got, err := scriptedAttempt(t, s)
		require.ErrorContains(t, err, "no data needed")
		require.False(t, isPermanent(err))
		require.Empty(t, got, "nothing refused the message")
	})
}

// Once the server has replied 250 to the message's data, it has the
// message: a session that fails after that (no reply to RSET or QUIT, or
// a refusal of either) leaves the job done, so that a retry does not send
// the message again.
func TestAcceptedMessageIsDoneWhateverFollows(t *testing.T) {
	t.Parallel()
	for name, replies := range map[string]script{
		"closed at RSET": {"RSET": hangUp},
		"refused RSET":   {"RSET": "554 5.5.1 no"},
		"closed at QUIT": {"QUIT": hangUp},
		"421 to QUIT":    {"QUIT": "421 4.3.0 bye"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := startScripted(t, replies)
			got, err := scriptedAttempt(t, s)
			require.NoError(t, err, "the server accepted the message")
			require.JSONEq(t, `{"smtp_code": 250, "reply": "2.0.0 queued as 17", "recipients": 1}`, got)
		})
	}
}

// A server that quotes AUTH PLAIN's credentials over two lines of its
// refusal of a recipient gives none of them away: the refusal is masked
// with its lines joined, in the error as in the result.
func TestAuthEchoSplitInARefusalStaysSecret(t *testing.T) {
	t.Parallel()
	cred := base64.StdEncoding.EncodeToString([]byte("\x00" + user + "\x00" + password))
	s := startScripted(t, script{
		"EHLO": "250-mx.example.test\r\n250-ENHANCEDSTATUSCODES\r\n250 AUTH PLAIN",
		"AUTH": "235 2.7.0 ok",
		"RCPT": "550-5.7.1 relaying denied to AUTH PLAIN " + cred[:16] + "\r\n550 5.7.1 " + cred[16:],
	})
	cfg := s.config()
	cfg.Username, cfg.AllowPlaintextAuth = user, true
	got, err := runAttempt(t, cfg, map[string]any{"to": []string{"ann@example.test"}, "subject": "s", "text": "t"})
	require.ErrorContains(t, err, "550")
	for _, out := range []string{err.Error(), got} {
		t.Log(out)
		require.Contains(t, out, "relaying denied")
		require.NotContains(t, out, cred[16:], "the tail of AUTH PLAIN: the password's last bytes")
	}
}

// A server's replies reach the error, and so last_error and the log
// lines, only as excerpts, escaped: however long each reply, however many
// recipients it refused, and whatever bytes it holds.
func TestLongRefusalIsAnExcerptInTheError(t *testing.T) {
	t.Parallel()
	line := "\x1b[2J\u202e" + strings.Repeat("y", 480)
	many := make([]string, email.DefaultMaxRecipients)
	for i := range many {
		many[i] = fmt.Sprintf("r%d@example.test", i)
	}
	for name, tc := range map[string]struct {
		replies script
		to      []string
	}{
		"a multi-line refusal":                 {script{"RCPT": strings.Repeat("550-5.1.1 "+line+"\r\n", 100) + "550 5.1.1 end"}, many[:1]},
		"a malformed reply":                    {script{"MAIL": "550x" + strings.Repeat(line, 100)}, many[:1]},
		"a refusal of each of many recipients": {script{"RCPT": "550 5.1.1 " + line}, many},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := startScripted(t, tc.replies)
			got, err := runAttempt(t, s.config(), map[string]any{"to": tc.to, "subject": "s", "text": "t"})
			require.Error(t, err)
			t.Logf("%d bytes: %.300s", len(err.Error()), err)
			require.Less(t, len(err.Error()), 2<<10, "excerpts of the replies")
			require.NotContains(t, err.Error(), "\x1b")
			require.NotContains(t, err.Error(), "\u202e")
			require.LessOrEqual(t, len(got), 512)
		})
	}
}

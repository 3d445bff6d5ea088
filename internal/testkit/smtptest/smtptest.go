// Package smtptest runs a real SMTP server (emersion/go-smtp) on a loopback
// port for tests. It requires AUTH PLAIN with the given credentials (none
// when the user is empty), answers
// RCPT TO for temp@... with 451 and for reject@... with 550, and records every
// message it accepts.
package smtptest

import (
	"crypto/tls"
	"io"
	"net"
	"net/mail"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Message is one message the server accepted.
type Message struct {
	From       string
	Recipients []string
	Header     mail.Header
	Body       string
}

// Server is a running SMTP server. Received gets every accepted message.
type Server struct {
	Host     string
	Port     int
	Received chan Message
	// Delay, when set before mail is sent, holds each message that long
	// before accepting it, so that sessions overlap.
	Delay time.Duration

	user, password string
	mu             sync.Mutex
	messages       []Message
	active, most   int // messages being received now, and at most
}

// MostAtOnce is the most messages that were being received at once: a
// lower bound of the sessions a client held open together.
func (s *Server) MostAtOnce() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.most
}

// Start runs a server until the test ends.
func Start(t testing.TB, user, password string) *Server {
	t.Helper()
	return start(t, user, password, nil, false)
}

// start runs a server that offers STARTTLS with tlsConfig when it is not
// nil, or speaks TLS from the first byte when implicit is true too.
func start(t testing.TB, user, password string, tlsConfig *tls.Config, implicit bool) *Server {
	t.Helper()
	s := &Server{Received: make(chan Message, 1000), user: user, password: password}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &session{s: s}, nil }))
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = true
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("smtptest: %v", err)
	}
	srv.TLSConfig = tlsConfig
	if implicit {
		l = tls.NewListener(l, tlsConfig)
	}
	host, port, _ := net.SplitHostPort(l.Addr().String())
	s.Host = host
	s.Port, _ = strconv.Atoi(port)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	// Close closes the listeners Serve has taken: the listener is closed
	// here too, for a test that ends before Serve took it.
	t.Cleanup(func() { _ = srv.Close(); _ = l.Close(); <-done })
	return s
}

// Messages returns every message accepted so far.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

type session struct {
	s      *Server
	authed bool
	from   string
	rcpt   []string
}

func (ss *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (ss *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, username, password string) error {
		if username != ss.s.user || password != ss.s.password {
			return &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "authentication failed"}
		}
		ss.authed = true
		return nil
	}), nil
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	if !ss.authed && ss.s.user != "" {
		return smtp.ErrAuthRequired
	}
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	switch {
	case strings.HasPrefix(to, "temp@"):
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "mailbox busy, try later"}
	case strings.HasPrefix(to, "reject@"):
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
	}
	ss.rcpt = append(ss.rcpt, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	ss.s.mu.Lock()
	ss.s.active++
	ss.s.most = max(ss.s.most, ss.s.active)
	ss.s.mu.Unlock()
	defer func() {
		ss.s.mu.Lock()
		ss.s.active--
		ss.s.mu.Unlock()
	}()
	m, err := mail.ReadMessage(r)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(m.Body)
	if err != nil {
		return err
	}
	if ss.s.Delay > 0 {
		time.Sleep(ss.s.Delay) // a slow server
	}
	msg := Message{From: ss.from, Recipients: ss.rcpt, Header: m.Header, Body: string(body)}
	ss.s.mu.Lock()
	ss.s.messages = append(ss.s.messages, msg)
	ss.s.mu.Unlock()
	select {
	case ss.s.Received <- msg:
	default:
	}
	return nil
}

func (ss *session) Reset()        { ss.from, ss.rcpt = "", nil }
func (ss *session) Logout() error { return nil }

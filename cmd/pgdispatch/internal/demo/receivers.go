package demo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/mail"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/emersion/go-smtp"
	amqp "github.com/rabbitmq/amqp091-go"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// A receipt is what a receiver got for one attempt of a job.
type receipt struct {
	attempt int // 0 when the receiver cannot tell
	text    string
}

// receipts holds the last receipt of each job and tells waiters of new ones.
type receipts struct {
	mu      sync.Mutex
	byJob   map[int64]receipt
	arrived chan struct{} // closed and replaced on each receipt
}

func newReceipts() *receipts {
	return &receipts{byJob: map[int64]receipt{}, arrived: make(chan struct{})}
}

func (r *receipts) add(jobID int64, rc receipt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byJob[jobID] = rc
	close(r.arrived)
	r.arrived = make(chan struct{})
}

// get returns the receipt of the attempt, waiting up to wait for one. A
// receipt that does not know its attempt matches any.
func (r *receipts) get(jobID int64, attempt int, wait time.Duration) (string, bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		rc, ok := r.byJob[jobID]
		arrived := r.arrived
		r.mu.Unlock()
		if ok && (rc.attempt == attempt || rc.attempt == 0) {
			return rc.text, true
		}
		select {
		case <-arrived:
		case <-deadline.C:
			return "", false
		}
	}
}

// webhookReceiver is the HTTP endpoint of the http_callback jobs. It
// verifies each request's signature as a real receiver would, with any
// secret it was given (accept), refusing an unsigned or forged one with
// 401. Under /flaky it answers every first attempt with 503 and
// Retry-After: 1.
type webhookReceiver struct {
	mu        sync.Mutex
	verifiers []*standardwebhooks.Webhook
	got       *receipts
	srv       *http.Server
	done      chan struct{}
	URL       string
}

// FlakyPath fails every first attempt, so that the job is retried.
const flakyPath = "/flaky"

func startWebhookReceiver(got *receipts) (*webhookReceiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("webhook receiver: %w", err)
	}
	r := &webhookReceiver{got: got, done: make(chan struct{}), URL: "http://" + l.Addr().String()}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { defer close(r.done); _ = r.srv.Serve(l) }()
	return r, nil
}

// accept makes the receiver accept requests signed by secret too, as a
// receiver told of a rotation's new secret does.
func (r *webhookReceiver) accept(secret string) error {
	verifier, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return fmt.Errorf("webhook receiver: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.verifiers = append(r.verifiers, verifier)
	return nil
}

// verify returns how many of the receiver's secrets signed the request,
// and the error of the last that did not.
func (r *webhookReceiver) verify(body []byte, header http.Header) (int, error) {
	r.mu.Lock()
	verifiers := r.verifiers
	r.mu.Unlock()
	n, err := 0, errors.New("no secret to verify with")
	for _, v := range verifiers {
		if e := v.Verify(body, header); e != nil {
			err = e
		} else {
			n++
		}
	}
	return n, err
}

func (r *webhookReceiver) close() {
	_ = r.srv.Close()
	<-r.done
}

func (r *webhookReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, "cannot read the body", http.StatusBadRequest)
		return
	}
	jobID, _ := strconv.ParseInt(req.Header.Get("Pgdispatch-Job-Id"), 10, 64)
	attempt, _ := strconv.Atoi(req.Header.Get("Pgdispatch-Attempt"))
	request := req.Method + " " + req.URL.Path
	// Recorded before the response goes out: when the job's attempt ends,
	// its receipt is there.
	signed, err := r.verify(body, req.Header)
	if signed == 0 {
		r.got.add(jobID, receipt{attempt, fmt.Sprintf("%s refused with 401: the signature does not verify (%v)", request, err)})
		http.Error(w, "invalid signature", http.StatusUnauthorized)
		return
	}
	if req.URL.Path == flakyPath && attempt == 1 {
		r.got.add(jobID, receipt{attempt, request + ", signature verified; answered 503 with Retry-After: 1, as it does to every first attempt"})
		w.Header().Set("Retry-After", "1")
		http.Error(w, "try again in a second", http.StatusServiceUnavailable)
		return
	}
	verified := "signature verified"
	if signed > 1 {
		verified = fmt.Sprintf("signatures by all %d secrets it knows verified", signed)
	}
	r.got.add(jobID, receipt{attempt, fmt.Sprintf("%s, %s, body %s", request, verified, compact(body))})
	w.WriteHeader(http.StatusNoContent)
}

// compact shortens a JSON body for one line.
func compact(body []byte) string {
	var b bytes.Buffer
	if json.Compact(&b, body) != nil {
		b.Reset()
		b.Write(body)
	}
	return oneLine(b.String(), 120)
}

// oneLine makes s fit on a line of the terminal: no control characters,
// at most limit runes.
func oneLine(s string, limit int) string {
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
	if r := []rune(s); len(r) > limit {
		s = string(r[:limit-3]) + "..."
	}
	return s
}

// mailCatcher is the SMTP server of the email jobs: plain SMTP on loopback,
// no authentication. It accepts every message except to refusedRecipient,
// which it refuses for good.
type mailCatcher struct {
	srv  *smtp.Server
	got  *receipts
	done chan struct{}
	Host string
	Port int
}

// refusedRecipient is refused with 550: its job is dead at once.
const refusedRecipient = "nobody@example.com"

func startMailCatcher(got *receipts) (*mailCatcher, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("mail catcher: %w", err)
	}
	c := &mailCatcher{got: got, done: make(chan struct{})}
	c.srv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &mailSession{c: c}, nil }))
	c.srv.Domain = "localhost"
	c.srv.MaxMessageBytes = 1 << 20
	c.srv.ReadTimeout, c.srv.WriteTimeout = 10*time.Second, 10*time.Second
	host, port, _ := net.SplitHostPort(l.Addr().String())
	c.Host = host
	c.Port, _ = strconv.Atoi(port)
	go func() { defer close(c.done); _ = c.srv.Serve(l) }()
	return c, nil
}

func (c *mailCatcher) close() {
	_ = c.srv.Close()
	<-c.done
}

type mailSession struct {
	c    *mailCatcher
	rcpt []string
}

func (s *mailSession) Mail(string, *smtp.MailOptions) error { return nil }

func (s *mailSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	if strings.EqualFold(to, refusedRecipient) {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such mailbox here"}
	}
	s.rcpt = append(s.rcpt, to)
	return nil
}

func (s *mailSession) Data(r io.Reader) error {
	m, err := mail.ReadMessage(r)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, m.Body); err != nil {
		return err
	}
	dec := new(mime.WordDecoder)
	subject, err := dec.DecodeHeader(m.Header.Get("Subject"))
	if err != nil {
		subject = m.Header.Get("Subject")
	}
	// The email executor names each message after its job: <job-ID.pgdispatch@domain>.
	id := strings.TrimPrefix(m.Header.Get("Message-Id"), "<job-")
	id, _, _ = strings.Cut(id, ".")
	jobID, _ := strconv.ParseInt(id, 10, 64)
	s.c.got.add(jobID, receipt{0, fmt.Sprintf("mail %q from %s to %s", subject, m.Header.Get("From"), strings.Join(s.rcpt, ", "))})
	return nil
}

func (s *mailSession) Reset()        { s.rcpt = nil }
func (s *mailSession) Logout() error { return nil }

// amqpConsumer reads the messages of the rabbitmq jobs from a queue of its
// own, which the broker names and deletes when the demo ends.
type amqpConsumer struct {
	conn  *amqp.Connection
	done  chan struct{}
	Queue string
}

func startAMQPConsumer(url string, got *receipts) (*amqpConsumer, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second), Properties: amqp.Table{"connection_name": "pgdispatch demo consumer"}})
	if err != nil {
		return nil, fmt.Errorf("connect to RABBITMQ_URL: %w", err)
	}
	ch, err := conn.Channel()
	var q amqp.Queue
	if err == nil {
		q, err = ch.QueueDeclare("", false, true, true, false, nil) // server-named, exclusive, auto-deleted
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(q.Name, "", true, true, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("rabbitmq consumer: %w", err)
	}
	c := &amqpConsumer{conn: conn, done: make(chan struct{}), Queue: q.Name}
	go func() {
		defer close(c.done)
		for d := range deliveries { // ends when the connection closes
			jobID, _ := strconv.ParseInt(d.MessageId, 10, 64)
			got.add(jobID, receipt{0, fmt.Sprintf("queue %s got message_id %s, body %s", q.Name, d.MessageId, compact(d.Body))})
		}
	}()
	return c, nil
}

func (c *amqpConsumer) close() {
	_ = c.conn.Close() // an error means it was closed already
	<-c.done
}

// Package email is the email executor: it sends the message a job's payload
// describes over SMTP, through go-mail.
//
// The payload is {"to": [...], "subject": "...", "text": "...", "html": "..."}
// with optional "cc", "bcc", "from" (default: the configured From),
// "reply_to" and "headers". At least one of text and html is required.
//
// Any writer of the jobs table sets the payload, so the executor bounds what
// it may send: the sender is Config.From unless Config.AllowFrom allows
// another address or domain, and one message has at most
// Config.MaxRecipients recipients. A payload outside them is dead at once,
// with the field named.
//
// The Message-ID is derived from the job id, so a retried job keeps it and
// receivers can deduplicate. A job is done once the server accepted its
// message (250 to its data), whatever fails after that. An SMTP 4xx reply
// and connection errors retry; a 5xx reply is permanent. The password is
// never sent over a connection without TLS unless Config.AllowPlaintextAuth
// says so.
//
// The server may be hostile, or someone on the path before STARTTLS: the
// executor reads at most MaxReplyBytes of one reply and 1 MiB over a
// session, its connection's deadlines stay within the attempt's, and the
// connection is closed when the attempt ends.
//
// Every attempt that got a reply records it as its result (see
// executors.RecordResult): the server's reply to the message's data when it
// accepted the message, else the reply that refused it. The reply, there
// and in errors, is masked (see redact.Reply) of the password, in any base64
// form as in an echoed AUTH PLAIN, and of the payload's secrets.
package email

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/mail"
	"net/textproto"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	gomail "github.com/wneessen/go-mail"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/redact"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
)

// Kind is the job kind this executor runs.
const Kind = "email"

// TLS modes.
const (
	TLSNone     = "none"     // plain SMTP; credentials travel unencrypted
	TLSStartTLS = "starttls" // STARTTLS is required
	TLSImplicit = "tls"      // TLS from the first byte (SMTPS)
)

// Config configures the executor.
type Config struct {
	// Host is the SMTP server. Required.
	Host string
	// Port defaults to 25 with TLS none, 587 with starttls and 465 with tls.
	Port int
	// Username and Password authenticate with AUTH PLAIN when Username is set.
	Username, Password string
	// TLS is none, starttls or tls. Default: starttls.
	TLS string
	// TLSConfig overrides the TLS settings, for a private CA. Its
	// ServerName defaults to Host.
	TLSConfig *tls.Config
	// From is the sender of jobs whose payload has none. A payload may name
	// its address with a display name of its own.
	From string
	// AllowFrom lists the other senders a payload's from may name: addresses
	// (alerts@example.com) or domains (example.com, any address at it, not
	// at its subdomains). "*" allows any sender. Default: none, so that every
	// message is sent from From's address. Without From, it must allow some.
	AllowFrom []string
	// MaxRecipients bounds the recipients of one message, in to, cc and bcc
	// together. Default: DefaultMaxRecipients.
	MaxRecipients int
	// AllowPlaintextAuth allows TLS none with a Username: the credentials
	// then cross the network unencrypted. New refuses that setting without it.
	AllowPlaintextAuth bool
	// Timeout bounds one delivery when the job's context has no earlier
	// deadline. Default: 30s.
	Timeout time.Duration
	// MaxConnections is how many SMTP sessions the executor opens at once;
	// email jobs beyond it wait for one, within their own deadline. Mail
	// servers often refuse more than a few connections from one client.
	// Default: 10.
	MaxConnections int
}

// DefaultMaxConnections is Config.MaxConnections's default.
const DefaultMaxConnections = 10

// DefaultMaxRecipients is Config.MaxRecipients's default.
const DefaultMaxRecipients = 50

// Executor sends email jobs. Create it with New; it is safe for concurrent use.
type Executor struct {
	cfg      Config
	opts     []gomail.Option
	senders  senders
	sessions chan struct{} // one token per open SMTP session
}

// senders are the addresses a payload's from may name, all in lower case.
type senders struct {
	any       bool
	addresses map[string]bool
	domains   map[string]bool
}

func (s senders) allow(address string) bool {
	address = strings.ToLower(address)
	_, domain, _ := strings.Cut(address, "@")
	return s.any || s.addresses[address] || s.domains[domain]
}

// parseSenders reads Config.AllowFrom, with From's address.
func parseSenders(from string, allow []string) (senders, error) {
	s := senders{addresses: map[string]bool{}, domains: map[string]bool{}}
	if from != "" {
		a, err := mail.ParseAddress(from)
		if err != nil {
			return s, fmt.Errorf("email: From %q is not an email address", from)
		}
		s.addresses[strings.ToLower(a.Address)] = true
	}
	for _, entry := range allow {
		entry = strings.TrimSpace(entry)
		switch {
		case entry == "":
		case entry == "*":
			s.any = true
		case strings.Contains(strings.TrimPrefix(entry, "@"), "@"):
			a, err := mail.ParseAddress(entry)
			if err != nil {
				return s, fmt.Errorf("email: AllowFrom %q is not an email address", entry)
			}
			s.addresses[strings.ToLower(a.Address)] = true
		default:
			domain := strings.ToLower(strings.TrimPrefix(entry, "@"))
			if !isDomain(domain) {
				return s, fmt.Errorf("email: AllowFrom %q: want an address (alerts@example.com), a domain (example.com) or *", entry)
			}
			s.domains[domain] = true
		}
	}
	if len(s.addresses) == 0 && len(s.domains) == 0 && !s.any {
		return s, errors.New("email: no sender is allowed: set From (SMTP_FROM), or AllowFrom (SMTP_ALLOW_FROM) to the addresses or domains payloads may send from")
	}
	return s, nil
}

// New checks cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	if cfg.Host == "" {
		return nil, errors.New("email: Host is required")
	}
	cfg.TLS = strings.ToLower(cmp.Or(cfg.TLS, TLSStartTLS))
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("email: Timeout %s: must not be negative", cfg.Timeout)
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, 30*time.Second)
	if cfg.MaxConnections < 0 {
		return nil, fmt.Errorf("email: MaxConnections %d: must not be negative", cfg.MaxConnections)
	}
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, DefaultMaxConnections)
	if cfg.MaxRecipients < 0 {
		return nil, fmt.Errorf("email: MaxRecipients %d: must not be negative", cfg.MaxRecipients)
	}
	cfg.MaxRecipients = cmp.Or(cfg.MaxRecipients, DefaultMaxRecipients)
	opts := []gomail.Option{gomail.WithTimeout(cfg.Timeout)}
	switch cfg.TLS {
	case TLSNone:
		cfg.Port = cmp.Or(cfg.Port, 25)
		opts = append(opts, gomail.WithTLSPolicy(gomail.NoTLS))
	case TLSStartTLS:
		cfg.Port = cmp.Or(cfg.Port, 587)
		opts = append(opts, gomail.WithTLSPolicy(gomail.TLSMandatory))
	case TLSImplicit:
		cfg.Port = cmp.Or(cfg.Port, 465)
		opts = append(opts, gomail.WithSSL())
	default:
		return nil, fmt.Errorf("email: TLS %q: want none, starttls or tls", cfg.TLS)
	}
	if cfg.Port <= 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("email: port %d is out of range", cfg.Port)
	}
	opts = append(opts, gomail.WithPort(cfg.Port))
	if cfg.TLSConfig == nil {
		cfg.TLSConfig = &tls.Config{MinVersion: gomail.DefaultTLSMinVersion}
	}
	if cfg.TLSConfig.ServerName == "" {
		cfg.TLSConfig = cfg.TLSConfig.Clone()
		cfg.TLSConfig.ServerName = cfg.Host
	}
	opts = append(opts, gomail.WithTLSConfig(cfg.TLSConfig))
	if cfg.Username != "" {
		auth := gomail.SMTPAuthPlain
		if cfg.TLS == TLSNone {
			if !cfg.AllowPlaintextAuth {
				return nil, errors.New("email: TLS none with a username would send the password unencrypted: " +
					"use TLS starttls or tls, or allow it explicitly (SMTP_ALLOW_PLAINTEXT_AUTH=true)")
			}
			auth = gomail.SMTPAuthPlainNoEnc // the operator chose plain SMTP, explicitly
		}
		opts = append(opts, gomail.WithSMTPAuth(auth), gomail.WithUsername(cfg.Username), gomail.WithPassword(cfg.Password))
	}
	senders, err := parseSenders(cfg.From, cfg.AllowFrom)
	if err != nil {
		return nil, err
	}
	return &Executor{cfg: cfg, opts: opts, senders: senders, sessions: make(chan struct{}, cfg.MaxConnections)}, nil
}

type payload struct {
	To      []string                   `json:"to"`
	Cc      []string                   `json:"cc"`
	Bcc     []string                   `json:"bcc"`
	From    string                     `json:"from"`
	ReplyTo string                     `json:"reply_to"`
	Subject *string                    `json:"subject"`
	Text    string                     `json:"text"`
	HTML    string                     `json:"html"`
	Headers map[string]json.RawMessage `json:"headers"`
	Timeout json.RawMessage            `json:"timeout"` // read by the claimer; checked here
}

// Headers the payload may not set: the executor writes them from its
// fields, or they name a sender, as only the payload's from may.
var managed = map[string]string{
	"from": "from", "to": "to", "cc": "cc", "bcc": "bcc", "reply-to": "reply_to", "subject": "subject",
	"sender": "from", "resent-from": "from", "resent-sender": "from",
	"message-id": "", "date": "", "mime-version": "", "content-type": "", "content-transfer-encoding": "",
}

// message is a validated payload.
type message struct {
	payload
	headers map[string]string
}

// isDomain reports whether s is a domain name in lower-case ASCII
// (punycode for others): labels of letters, digits and inner hyphens,
// separated by dots.
func isDomain(s string) bool {
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return false
		}
	}
	return true
}

// policy is what a payload may ask for beyond its shape.
type policy struct {
	senders       *senders // nil: any
	maxRecipients int      // 0: any number
}

// parse validates a payload against the default sender and the policy.
// Errors are permanent and name the field.
func parse(raw json.RawMessage, defaultFrom string, pol policy) (*message, error) {
	var p payload
	if err := executors.DecodePayload(raw, &p); err != nil {
		return nil, err
	}
	if len(p.To) == 0 {
		return nil, executors.Invalid("to", "needs at least one address")
	}
	if n := len(p.To) + len(p.Cc) + len(p.Bcc); pol.maxRecipients > 0 && n > pol.maxRecipients {
		return nil, executors.Invalid("to", "%d recipients in to, cc and bcc: at most %d are allowed (SMTP_MAX_RECIPIENTS)", n, pol.maxRecipients)
	}
	for _, list := range []struct {
		field string
		addrs []string
	}{{"to", p.To}, {"cc", p.Cc}, {"bcc", p.Bcc}} {
		for i, a := range list.addrs {
			if err := checkAddress(a); err != nil {
				return nil, executors.Invalid(fmt.Sprintf("%s[%d]", list.field, i), "%v", err)
			}
		}
	}
	p.From = cmp.Or(p.From, defaultFrom)
	if p.From == "" {
		return nil, executors.Invalid("from", "is required when SMTP_FROM is not set")
	}
	if err := checkAddress(p.From); err != nil {
		return nil, executors.Invalid("from", "%v", err)
	}
	if pol.senders != nil {
		if a, _ := mail.ParseAddress(p.From); !pol.senders.allow(a.Address) {
			return nil, executors.Invalid("from", "%q is not an allowed sender: SMTP_FROM's address, or one SMTP_ALLOW_FROM allows", a.Address)
		}
	}
	if p.ReplyTo != "" {
		if err := checkAddress(p.ReplyTo); err != nil {
			return nil, executors.Invalid("reply_to", "%v", err)
		}
	}
	if p.Subject == nil {
		return nil, executors.Invalid("subject", "is required")
	}
	if strings.ContainsAny(*p.Subject, "\r\n\x00") {
		return nil, executors.Invalid("subject", "must not contain CR, LF or NUL")
	}
	if p.Text == "" && p.HTML == "" {
		return nil, executors.Invalid("text", "or html is required")
	}
	if strings.ContainsRune(p.Text, 0) {
		return nil, executors.Invalid("text", "must not contain NUL")
	}
	if strings.ContainsRune(p.HTML, 0) {
		return nil, executors.Invalid("html", "must not contain NUL")
	}
	headers, err := executors.Headers("headers", p.Headers)
	if err != nil {
		return nil, err
	}
	for name := range headers {
		if field, ok := managed[strings.ToLower(name)]; ok {
			if field != "" {
				return nil, executors.Invalid("headers."+name, "set it with the payload's %q field", field)
			}
			return nil, executors.Invalid("headers."+name, "is set by pgdispatch")
		}
	}
	if _, _, err := executors.PayloadDuration(raw, "timeout"); err != nil {
		return nil, executors.Permanent(err)
	}
	return &message{payload: p, headers: headers}, nil
}

func checkAddress(a string) error {
	if strings.ContainsAny(a, "\r\n\x00") {
		return errors.New("must not contain CR, LF or NUL")
	}
	if _, err := mail.ParseAddress(a); err != nil {
		return fmt.Errorf("%q is not an email address", a)
	}
	return nil
}

// Validate reports whether payload is a valid email payload when the
// configured sender is defaultFrom. It checks the payload's shape; an
// Executor also applies its Config's AllowFrom and MaxRecipients.
func Validate(payload json.RawMessage, defaultFrom string) error {
	_, err := parse(payload, defaultFrom, policy{})
	return err
}

// MessageID is the Message-ID of job id's mail, without angle brackets.
func MessageID(jobID int64, from string) string {
	domain := "pgdispatch.invalid"
	if a, err := mail.ParseAddress(from); err == nil {
		if i := strings.LastIndexByte(a.Address, '@'); i >= 0 && i < len(a.Address)-1 {
			domain = a.Address[i+1:]
		}
	}
	return "job-" + strconv.FormatInt(jobID, 10) + ".pgdispatch@" + domain
}

// Execute implements executors.Executor.
func (e *Executor) Execute(ctx context.Context, job *executors.Job) (err error) {
	p, err := parse(job.Payload, e.cfg.From, policy{senders: &e.senders, maxRecipients: e.cfg.MaxRecipients})
	if err != nil {
		return err
	}
	m := gomail.NewMsg()
	if err := build(m, p, job.ID); err != nil {
		return executors.Permanent(err)
	}
	ctx, span := tracing.StartClient(ctx, trace.SpanKindClient, "smtp send", e.spanAttributes)
	defer func() { tracing.End(span, err) }()
	// The attempt's trace context, as Traceparent and Tracestate headers.
	tracing.Inject(ctx, msgCarrier{m})
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.cfg.Timeout)
		defer cancel()
	}
	// Ended as Execute returns, which closes the session's connection.
	ctx, end := context.WithCancel(ctx)
	defer end()
	known := redact.NewSecrets(append(redact.PayloadSecrets(job.Payload), e.cfg.Password)...)
	client, err := gomail.NewClient(e.cfg.Host, append(slices.Clip(e.opts), gomail.WithDialContextFunc(e.dialer(ctx)))...)
	if err != nil {
		return executors.Permanent(maskReply(fmt.Errorf("email: client: %w", err), known))
	}
	var refusals rcptRefusals
	client.ErrorHandlerRegistry.RegisterHandler(e.cfg.Host, "rcpt", &refusals)
	select {
	case e.sessions <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("email: no SMTP session free before the job's deadline (%d at once): %w", e.cfg.MaxConnections, context.Cause(ctx))
	}
	defer func() { <-e.sessions }()
	err = client.DialAndSendWithContext(ctx, m)
	err = maskReplies(err, known)
	if r, ok := serverReply(m, err, &refusals, len(p.To)+len(p.Cc)+len(p.Bcc), known); ok {
		_ = executors.RecordResult(ctx, r)
	}
	// A message the server accepted is sent, whatever failed after it (the
	// RSET and the QUIT that follow): a retry would send it again.
	if err != nil && !m.IsDelivered() {
		return e.classify(ctx, err, &refusals, known)
	}
	return nil
}

const maxReply = 256

// spanAttributes are the attributes of a message's client span.
func (e *Executor) spanAttributes() []attribute.KeyValue {
	return []attribute.KeyValue{semconv.ServerAddress(e.cfg.Host), semconv.ServerPort(e.cfg.Port)}
}

// msgCarrier sets the trace context in a message's headers.
type msgCarrier struct{ m *gomail.Msg }

func (c msgCarrier) Get(key string) string {
	if v := c.m.GetGenHeader(gomail.Header(textproto.CanonicalMIMEHeaderKey(key))); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c msgCarrier) Set(key, value string) {
	c.m.SetGenHeader(gomail.Header(textproto.CanonicalMIMEHeaderKey(key)), value)
}

func (msgCarrier) Keys() []string { return []string{"Traceparent", "Tracestate"} }

// reply is the result an attempt records.
type reply struct {
	// SMTPCode is the reply's code: 250 when the server accepted the message.
	SMTPCode int `json:"smtp_code"`
	// EnhancedStatus is the RFC 3463 status of a refusal, when the server
	// gives them.
	EnhancedStatus string `json:"enhanced_status,omitempty"`
	// Command is the command a refusal answered, when go-mail says.
	Command string `json:"command,omitempty"`
	// Reply is the reply's text, after its code.
	Reply string `json:"reply,omitempty"`
	// Recipients is how many recipients an accepted message had.
	Recipients int `json:"recipients,omitempty"`
}

// serverReply reads the server's reply from what go-mail returned: the
// reply to the message's data when the server accepted it (even if the
// session failed after that), or else the reply that refused it. ok is
// false when no reply is known, as after a connection error.
func serverReply(m *gomail.Msg, err error, refusals *rcptRefusals, recipients int, known *redact.Secrets) (reply, bool) {
	if m.IsDelivered() {
		// go-mail accepts only 250 to the end of the data.
		return reply{SMTPCode: 250, Reply: replyText(m.ServerResponse(), known), Recipients: recipients}, true
	}
	var (
		sendErr  *gomail.SendError
		protoErr *textproto.Error
	)
	// go-mail joins to a failed message's SendError the failure of the QUIT
	// that follows it, whose reply refused nothing.
	switch {
	case errors.As(err, &sendErr):
		code, status := refusals.refusal(sendErr)
		if code == 0 {
			return reply{}, false
		}
		return reply{
			SMTPCode: code, EnhancedStatus: status,
			Command: commands[sendErr.Reason], Reply: replyText(sendErrReply(sendErr), known),
		}, true
	case errors.As(err, &protoErr): // before a message: the greeting, EHLO, STARTTLS or AUTH
		return reply{SMTPCode: protoErr.Code, Reply: replyText(protoErr.Msg, known)}, true
	}
	return reply{}, false
}

// commands are the commands whose replies go-mail's SendError reasons are.
var commands = map[gomail.SendErrReason]string{
	gomail.ErrSMTPMailFrom:  "MAIL FROM",
	gomail.ErrSMTPRcptTo:    "RCPT TO",
	gomail.ErrSMTPData:      "DATA",
	gomail.ErrSMTPDataClose: "end of data",
	gomail.ErrSMTPReset:     "RSET",
	gomail.ErrConnCheck:     "NOOP",
}

// rcptRefusals sees the server's refusals of RCPT TO as go-mail reads
// them, and keeps the worst: go-mail tries every recipient, and its
// SendError has the last refusal's code, so that a 5xx for one recipient
// and a 4xx for the next would read as a 4xx, and retry to meet the 5xx
// again.
type rcptRefusals struct{ worst *textproto.Error }

// HandleError implements go-mail's smtp.ResponseErrorHandler: it returns
// err as it is.
func (r *rcptRefusals) HandleError(_, _ string, _ *textproto.Conn, err error) error {
	var protoErr *textproto.Error
	if errors.As(err, &protoErr) && (r.worst == nil || protoErr.Code/100 > r.worst.Code/100) {
		r.worst = protoErr
	}
	return err
}

// refusal is the code and enhanced status of the reply that refused
// sendErr's message: its own, or, at RCPT TO, the worst refusal of any
// recipient.
func (r *rcptRefusals) refusal(sendErr *gomail.SendError) (code int, status string) {
	code, status = sendErr.ErrorCode(), sendErr.EnhancedStatusCode()
	if w := r.worst; sendErr.Reason == gomail.ErrSMTPRcptTo && w != nil && w.Code/100 > code/100 {
		return w.Code, strings.TrimSpace(enhancedStatus.FindString(w.Msg))
	}
	return code, status
}

// sendErrReply is the text of the replies a SendError holds. go-mail keeps
// them unexported, and writes them in its Error after the reason and
// before the recipients and the message id: "<reason>: <code> <text>[,
// <code> <text>…], affected recipient(s): …, affected message ID: …", each
// reply as textproto.Error writes it, its text quoted. One reply whose code
// is the error's is returned as its text alone.
func sendErrReply(err *gomail.SendError) string {
	s := strings.TrimPrefix(err.Error(), err.Reason.String()+":")
	if id := err.MessageID(); id != "" {
		s = strings.TrimSuffix(s, ", affected message ID: "+id)
	}
	if i := strings.LastIndex(s, ", affected recipient(s): "); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimSpace(s)
	if text, ok := strings.CutPrefix(s, strconv.Itoa(err.ErrorCode())+" "); ok {
		if unquoted, err := strconv.Unquote(text); err == nil {
			return unquoted
		}
		return text
	}
	return s
}

// replyText makes a server's reply fit a result: masked of the known
// secrets and of what looks like one (see replyLines), printable, bounded.
func replyText(s string, known *redact.Secrets) string {
	return strings.TrimSpace(executors.Excerpt(replyLines(s, known), maxReply))
}

func build(m *gomail.Msg, p *message, jobID int64) error {
	if err := m.From(p.From); err != nil {
		return fmt.Errorf("payload.from: %w", err)
	}
	if err := m.To(p.To...); err != nil {
		return fmt.Errorf("payload.to: %w", err)
	}
	if len(p.Cc) > 0 {
		if err := m.Cc(p.Cc...); err != nil {
			return fmt.Errorf("payload.cc: %w", err)
		}
	}
	if len(p.Bcc) > 0 {
		if err := m.Bcc(p.Bcc...); err != nil {
			return fmt.Errorf("payload.bcc: %w", err)
		}
	}
	if p.ReplyTo != "" {
		if err := m.ReplyTo(p.ReplyTo); err != nil {
			return fmt.Errorf("payload.reply_to: %w", err)
		}
	}
	m.Subject(*p.Subject)
	m.SetMessageIDWithValue(MessageID(jobID, p.From))
	m.SetDate()
	for name, value := range p.headers {
		m.SetGenHeader(gomail.Header(textproto.CanonicalMIMEHeaderKey(name)), value)
	}
	switch {
	case p.Text != "" && p.HTML != "":
		m.SetBodyString(gomail.TypeTextPlain, p.Text)
		m.AddAlternativeString(gomail.TypeTextHTML, p.HTML)
	case p.Text != "":
		m.SetBodyString(gomail.TypeTextPlain, p.Text)
	default:
		m.SetBodyString(gomail.TypeTextHTML, p.HTML)
	}
	return nil
}

// classify: a 4xx reply retries and a 5xx reply is permanent, whether it
// came at AUTH, MAIL, RCPT or DATA; network errors retry. A failed message
// is judged by its SendError alone: go-mail joins to it the failure of the
// QUIT that follows, whose reply refused nothing.
func (e *Executor) classify(ctx context.Context, err error, refusals *rcptRefusals, known *redact.Secrets) error {
	err = maskReply(fmt.Errorf("email: %s:%d: %w", e.cfg.Host, e.cfg.Port, err), known)
	var (
		sendErr  *gomail.SendError
		protoErr *textproto.Error
	)
	switch {
	case ctx.Err() != nil:
		return err
	case errors.As(err, &sendErr):
		// A SendError without a code is no refusal: the connection failed
		// (closed, timed out, a reply past MaxReplyBytes), or the server
		// replied neither 4xx nor 5xx where another reply was due.
		if code, _ := refusals.refusal(sendErr); code >= 500 {
			return executors.Permanent(err)
		}
		return err
	case errors.As(err, &protoErr):
		if protoErr.Code >= 500 {
			return executors.Permanent(err)
		}
		return err
	}
	return err // connection errors and timeouts retry
}

// quoted is a string as %q writes it, as textproto's errors write each
// reply of the server (its code, then its text quoted) and each line they
// could not read as one.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// maskReplies makes the server's replies that err quotes in its text
// (which go-mail formats as it wraps them, some in a SendError that
// errors.As cannot look into) what the result holds: each reply is
// unquoted, and replaced, in quotes, by its text as replyText makes it,
// masked and at most maxReply bytes. %q escapes a quote or a backslash of a
// secret, and writes the line breaks of a multi-line reply as \n, which
// would hide the secret, or the credentials wrapped over two lines, from a
// mask of the text.
func maskReplies(err error, known *redact.Secrets) error {
	return executors.MaskError(err, func(s string) string {
		return quoted.ReplaceAllStringFunc(s, func(q string) string {
			reply, err := strconv.Unquote(q)
			if err != nil {
				return q
			}
			return `"` + replyText(reply, known) + `"`
		})
	})
}

// enhancedStatus is the RFC 3463 status that begins each line of a reply.
var enhancedStatus = regexp.MustCompile(`^[245]\.[0-9]{1,3}\.[0-9]{1,3} `)

// replyLines masks the text of a reply (see redact.Reply) line by line,
// and its lines joined, without the status that begins each: a server that
// quotes AUTH PLAIN may wrap the credentials over two lines. When the lines
// joined hold more to mask than each line, the reply is given joined.
func replyLines(msg string, known *redact.Secrets) string {
	masked := redact.Reply(msg, known)
	if !strings.Contains(msg, "\n") {
		return masked
	}
	join := func(s string) string {
		lines := strings.Split(s, "\n")
		if status := enhancedStatus.FindString(lines[0]); status != "" {
			for i := 1; i < len(lines); i++ {
				lines[i] = strings.TrimPrefix(lines[i], status)
			}
		}
		return strings.Join(lines, "")
	}
	if joined := redact.Reply(join(msg), known); joined != join(masked) {
		return joined
	}
	return masked
}

// maxErrorText bounds the text of an error that quotes the server's
// replies: a refusal of each of many recipients quotes each.
const maxErrorText = 1 << 10

// maskReply masks an error that may quote the server's reply: of the
// password, the payload's secrets and what looks like a secret (see
// redact.Reply), as the result's reply is. Its text is an excerpt (see
// executors.Excerpt) of at most maxErrorText bytes.
func maskReply(err error, known *redact.Secrets) error {
	return executors.MaskError(err, func(s string) string {
		return executors.Excerpt(redact.Reply(s, known), maxErrorText)
	})
}

// Package rabbitmq is the rabbitmq executor: it publishes a job's message to
// RabbitMQ with publisher confirms, through amqp091-go.
//
// The payload is {"exchange": "", "routing_key": "...", "body": ...} with
// optional "headers" and "content_type" (application/json). body follows the
// http_callback rule: a JSON string is sent raw, any other value as JSON.
//
// Messages are persistent, published mandatory, and carry the job id as
// message_id so that consumers can deduplicate. The payload may not set the
// CC and BCC headers (in any case), with which RabbitMQ would route the
// message to the queues they name besides routing_key's. A job is done only when the
// broker has confirmed its message: a nack, a return (unroutable), a closed
// channel or no confirm before the job's deadline all mean retry.
//
// Every attempt that published records the broker's answer as its result
// (see executors.RecordResult): {"broker": "ack"} when done; "nack",
// "return" (with the broker's reply_code and reply_text), "timeout",
// "cancelled", "closed" (the channel closed before the confirm) or
// "unsent" (the publish itself failed) otherwise.
//
// A message the broker sends back is read only up to MaxContentBytes, and
// its reply text is masked (see redact.Reply) of the payload's secrets.
//
// The executor keeps one connection and a small pool of confirm-mode
// channels. When the broker closes the connection, takes none of a write
// within Config.WriteTimeout, or not all of a job's message by the job's
// deadline, it reconnects on the next job, backing off while the broker
// stays unreachable; jobs meanwhile fail and retry.
package rabbitmq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/redact"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
)

// Kind is the job kind this executor runs.
const Kind = "rabbitmq"

const (
	defaultChannels     = 4
	defaultDialTimeout  = 10 * time.Second
	defaultWriteTimeout = 30 * time.Second
	defaultReconnectMin = 200 * time.Millisecond
	defaultReconnectMax = 10 * time.Second
	maxShortString      = 255
	maxReplyText        = 256
)

// Config configures the executor.
type Config struct {
	// URL is the broker, as amqp://user:password@host:5672/vhost. Required.
	URL string
	// Name is the connection name the broker shows. Default: "pgdispatch".
	Name string
	// Channels is how many confirm-mode channels publish at once. Default: 4.
	Channels int
	// DialTimeout bounds connecting. Default: 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds each write to the broker's socket. A broker that
	// stops reading (a memory or disk alarm, a stalled network) fails the
	// connection after it: the jobs publishing on it fail and retry, and
	// later jobs publish on a new connection. A job's publish is bounded
	// by the job's deadline as well. Default: 30s.
	WriteTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the backoff between failed
	// connection attempts. Defaults: 200ms and 10s.
	ReconnectMin, ReconnectMax time.Duration
	// Logger receives connection events. Default: no logging.
	Logger *zap.Logger
}

// Executor publishes rabbitmq jobs. Create it with New and Close it when the
// worker has stopped.
type Executor struct {
	cfg    Config
	logger *zap.Logger
	slots  chan struct{} // one per channel allowed

	mu       sync.Mutex
	conn     *amqp.Connection
	wire     *guardedConn // conn's socket
	idle     []*channel
	opening  *opening // the channel being opened, if any
	failures int
	nextDial time.Time
	lastErr  error
	closed   bool
}

// opening is a channel being opened into the idle pool, connecting first
// when needed, for the jobs waiting for one: done closes when it is there,
// or err says why it is not.
type opening struct {
	done chan struct{}
	err  error
}

type channel struct {
	ch      *amqp.Channel
	wire    *guardedConn // its connection's socket
	returns chan amqp.Return
	closed  chan *amqp.Error // why the channel closed, or its connection
}

// closeReason is why ch closed, when amqp091-go has said: ": " and the
// reason, or "".
func (ch *channel) closeReason() string {
	select {
	case err := <-ch.closed:
		if err != nil {
			return ": " + err.Reason
		}
	default:
	}
	return ""
}

// New checks cfg and returns an Executor. It connects on the first job.
func New(cfg Config) (*Executor, error) {
	if cfg.URL == "" {
		return nil, errors.New("rabbitmq: URL is required")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid URL: %w", redactErr(err, cfg.URL))
	}
	cfg.Name = cmp.Or(cfg.Name, "pgdispatch")
	cfg.Channels = cmp.Or(cfg.Channels, defaultChannels)
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, defaultDialTimeout)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, defaultWriteTimeout)
	cfg.ReconnectMin = cmp.Or(cfg.ReconnectMin, defaultReconnectMin)
	cfg.ReconnectMax = max(cmp.Or(cfg.ReconnectMax, defaultReconnectMax), cfg.ReconnectMin)
	if cfg.Channels < 0 || cfg.DialTimeout < 0 || cfg.WriteTimeout < 0 {
		return nil, errors.New("rabbitmq: Channels, DialTimeout and WriteTimeout must not be negative")
	}
	return &Executor{
		cfg:    cfg,
		logger: cmp.Or(cfg.Logger, zap.NewNop()).Named("rabbitmq"),
		slots:  make(chan struct{}, cfg.Channels),
	}, nil
}

type payload struct {
	Exchange    string          `json:"exchange"`
	RoutingKey  *string         `json:"routing_key"`
	Body        json.RawMessage `json:"body"`
	Headers     map[string]any  `json:"headers"`
	ContentType string          `json:"content_type"`
	Timeout     json.RawMessage `json:"timeout"` // read by the claimer; checked here
}

type message struct {
	exchange, key string
	publishing    amqp.Publishing
	payload       json.RawMessage
}

// secrets are the secrets of the job's payload, which a broker's reply
// text might quote.
func (m *message) secrets() *redact.Secrets {
	return redact.NewSecrets(redact.PayloadSecrets(m.payload)...)
}

// mask masks an error that may quote the broker's words (a channel or a
// connection closed with a reason) as any peer's reply is.
func (m *message) mask(err error) error {
	known := m.secrets()
	return executors.MaskError(err, func(s string) string { return redact.Reply(s, known) })
}

// parse validates a payload. Errors are permanent and name the field.
func parse(raw json.RawMessage) (*message, error) {
	var p payload
	if err := executors.DecodePayload(raw, &p); err != nil {
		return nil, err
	}
	if p.RoutingKey == nil {
		return nil, executors.Invalid("routing_key", "is required (a queue name for the default exchange)")
	}
	if *p.RoutingKey == "" && p.Exchange == "" {
		return nil, executors.Invalid("routing_key", "must name a queue when exchange is the default \"\"")
	}
	if len(*p.RoutingKey) > maxShortString {
		return nil, executors.Invalid("routing_key", "must be at most %d bytes", maxShortString)
	}
	if len(p.Exchange) > maxShortString {
		return nil, executors.Invalid("exchange", "must be at most %d bytes", maxShortString)
	}
	if len(p.Body) == 0 {
		return nil, executors.Invalid("body", "is required")
	}
	if len(p.ContentType) > maxShortString {
		return nil, executors.Invalid("content_type", "must be at most %d bytes", maxShortString)
	}
	headers := amqp.Table{}
	for k, v := range p.Headers {
		if k == "" || len(k) > maxShortString {
			return nil, executors.Invalid("headers", "names must be 1 to %d bytes", maxShortString)
		}
		if strings.EqualFold(k, "CC") || strings.EqualFold(k, "BCC") {
			return nil, executors.Invalid("headers."+k, "is refused: the broker would also route the message to the queues it names; name one queue with routing_key, or bind more to an exchange")
		}
		headers[k] = toAMQP(v)
	}
	if err := headers.Validate(); err != nil {
		return nil, executors.Invalid("headers", "%v", err)
	}
	if _, _, err := executors.PayloadDuration(raw, "timeout"); err != nil {
		return nil, executors.Permanent(err)
	}
	return &message{
		exchange: p.Exchange,
		key:      *p.RoutingKey,
		payload:  raw,
		publishing: amqp.Publishing{
			Headers:      headers,
			ContentType:  cmp.Or(p.ContentType, "application/json"),
			DeliveryMode: amqp.Persistent,
			Body:         executors.Body(p.Body),
		},
	}, nil
}

// toAMQP turns decoded JSON into values an AMQP table holds.
func toAMQP(v any) any {
	switch v := v.(type) {
	case map[string]any:
		t := amqp.Table{}
		for k, x := range v {
			t[k] = toAMQP(x)
		}
		return t
	case []any:
		for i := range v {
			v[i] = toAMQP(v[i])
		}
		return v
	}
	return v
}

// Validate reports whether payload is a valid rabbitmq payload.
func Validate(payload json.RawMessage) error {
	_, err := parse(payload)
	return err
}

// Execute implements executors.Executor.
func (e *Executor) Execute(ctx context.Context, job *executors.Job) error {
	m, err := parse(job.Payload)
	if err != nil {
		return err
	}
	m.publishing.MessageId = strconv.FormatInt(job.ID, 10)
	m.publishing.Timestamp = time.Now()

	select {
	case e.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq: no channel free before the job's deadline: %w", context.Cause(ctx))
	}
	defer func() { <-e.slots }()
	ch, err := e.acquire(ctx)
	if err != nil {
		return err
	}
	ctx, span := tracing.StartClient(ctx, trace.SpanKindProducer, "send "+m.exchange, m.spanAttributes)
	// The attempt's trace context, over any the payload's headers set.
	tracing.Inject(ctx, tableCarrier(m.publishing.Headers))
	err = e.publish(ctx, ch, m)
	tracing.End(span, err)
	e.release(ch, err == nil || isBrokerAnswer(err))
	return err
}

// tableCarrier sets the trace context in a message's headers.
type tableCarrier amqp.Table

func (t tableCarrier) Get(key string) string {
	s, _ := t[key].(string)
	return s
}

func (t tableCarrier) Set(key, value string) { t[key] = value }

func (t tableCarrier) Keys() []string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	return keys
}

// spanAttributes are the attributes of the span of m's publishing.
func (m *message) spanAttributes() []attribute.KeyValue {
	return []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
		semconv.MessagingDestinationName(m.exchange), semconv.MessagingRabbitMQDestinationRoutingKey(m.key),
		semconv.MessagingMessageID(m.publishing.MessageId),
	}
}

// brokerAnswer is a failure the broker told us about on a healthy channel:
// the channel can be used again.
type brokerAnswer struct{ error }

func isBrokerAnswer(err error) bool {
	var b brokerAnswer
	return errors.As(err, &b)
}

// answer is the result an attempt records: what the broker said of the
// message, or why it said nothing.
type answer struct {
	Broker    string `json:"broker"`
	ReplyCode uint16 `json:"reply_code,omitempty"`
	ReplyText string `json:"reply_text,omitempty"`
}

func record(ctx context.Context, a answer) { _ = executors.RecordResult(ctx, a) }

func (e *Executor) publish(ctx context.Context, ch *channel, m *message) error {
	target := fmt.Sprintf("exchange %q routing key %q", m.exchange, m.key)
	if err := ctx.Err(); err != nil {
		record(ctx, answer{Broker: "unsent"})
		return fmt.Errorf("rabbitmq: publish to %s: %w", target, err)
	}
	// A message cannot be left halfway through its frames: a publish still
	// writing at the job's deadline (the broker takes none of it, or too
	// little) fails the connection, as a write past WriteTimeout does.
	stop := context.AfterFunc(ctx, func() {
		_ = ch.wire.fail(fmt.Errorf("the broker did not take the message before the job's deadline: %w", context.Cause(ctx)))
	})
	dc, err := ch.ch.PublishWithDeferredConfirmWithContext(ctx, m.exchange, m.key, true, false, m.publishing)
	stop()
	if err != nil {
		record(ctx, answer{Broker: "unsent"})
		return m.mask(fmt.Errorf("rabbitmq: publish to %s: %w", target, err))
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			record(ctx, answer{Broker: "timeout"})
		} else {
			record(ctx, answer{Broker: "cancelled"})
		}
		return fmt.Errorf("rabbitmq: no confirm from the broker for %s before the job's deadline: %w", target, err)
	}
	if !acked {
		if ch.ch.IsClosed() {
			record(ctx, answer{Broker: "closed"})
			return m.mask(fmt.Errorf("rabbitmq: channel closed before the broker confirmed %s%s", target, ch.closeReason()))
		}
		record(ctx, answer{Broker: "nack"})
		return brokerAnswer{fmt.Errorf("rabbitmq: the broker nacked the message to %s", target)}
	}
	if r, ok := returned(ch.returns, m.publishing.MessageId); ok {
		text := strings.TrimSpace(executors.Excerpt(redact.Reply(r.ReplyText, m.secrets()), maxReplyText))
		record(ctx, answer{Broker: "return", ReplyCode: r.ReplyCode, ReplyText: text})
		return brokerAnswer{fmt.Errorf("rabbitmq: unroutable: %s matched no queue (%d %s)", target, r.ReplyCode, text)}
	}
	record(ctx, answer{Broker: "ack"})
	return nil
}

// returned finds the return of the message id among those the broker sent
// back on a channel, once the broker has acked it. A mandatory message that
// no queue took comes back before its ack, on the same channel, so it is
// already in returns; the returns of earlier messages, whose jobs already
// failed, are dropped. amqp091-go closes returns when the channel closes,
// after what it holds.
func returned(returns <-chan amqp.Return, id string) (amqp.Return, bool) {
	for {
		select {
		case r, open := <-returns:
			if !open {
				return amqp.Return{}, false
			}
			if r.MessageId == id {
				return r, true
			}
		default:
			return amqp.Return{}, false
		}
	}
}

// acquire returns an open channel: an idle one, else one opened for it,
// connecting first when needed. The broker may answer neither (a stopped
// broker; under a memory alarm RabbitMQ reads nothing, and keeps the
// connection up as long as the alarm lasts), so one opening at a time goes
// on in the background, for this job or the next, and a job waits for it no
// longer than ctx.
func (e *Executor) acquire(ctx context.Context) (*channel, error) {
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, errors.New("rabbitmq: executor closed")
		}
		e.dropBrokenLocked()
		for len(e.idle) > 0 {
			ch := e.idle[len(e.idle)-1]
			e.idle = e.idle[:len(e.idle)-1]
			if !ch.ch.IsClosed() {
				e.mu.Unlock()
				return ch, nil
			}
		}
		o := e.opening
		if o == nil {
			o = &opening{done: make(chan struct{})}
			e.opening = o
			go e.open(o)
		}
		e.mu.Unlock()
		select {
		case <-o.done:
			if o.err != nil {
				return nil, o.err
			}
			// The channel is in the pool, unless a job took it first.
		case <-ctx.Done():
			return nil, fmt.Errorf("rabbitmq: no channel opened before the job's deadline: %w", context.Cause(ctx))
		}
	}
}

// dropBrokenLocked lets go of a connection that failed a write: amqp091-go
// shuts it down in the background, and may not have yet, so that its
// channels, still open, are kept out of the pool (see pool).
func (e *Executor) dropBrokenLocked() {
	if e.conn != nil && !e.conn.IsClosed() && e.wire.broken() != nil {
		e.logger.Warn("the broker connection failed a write", zap.Error(e.wire.broken()))
		go func(c *amqp.Connection) { _ = c.Close() }(e.conn)
		e.conn, e.wire, e.idle = nil, nil, nil
	}
}

// open opens a channel into the idle pool, connecting first when needed,
// and ends o.
func (e *Executor) open(o *opening) {
	ch, err := e.openChannel()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.opening = nil
	o.err = err
	close(o.done)
	if err != nil {
		return
	}
	e.pool(ch)
}

func (e *Executor) openChannel() (*channel, error) {
	e.mu.Lock()
	e.dropBrokenLocked()
	conn, wire := e.conn, e.wire
	e.mu.Unlock()
	if conn == nil || conn.IsClosed() {
		var err error
		if conn, wire, err = e.dial(); err != nil {
			return nil, err
		}
	}
	c, err := conn.Channel()
	if err == nil {
		err = c.Confirm(false)
	}
	if err != nil {
		if c != nil {
			discard(&channel{ch: c})
		}
		return nil, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	return &channel{
		ch:      c,
		wire:    wire,
		returns: c.NotifyReturn(make(chan amqp.Return, e.cfg.Channels+1)),
		closed:  c.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// dial connects to the broker, unless the last attempt failed less than
// the backoff ago. Only the opening in progress dials.
func (e *Executor) dial() (*amqp.Connection, *guardedConn, error) {
	e.mu.Lock()
	wait, lastErr := time.Until(e.nextDial), e.lastErr
	e.mu.Unlock()
	if wait > 0 {
		return nil, nil, fmt.Errorf("rabbitmq: broker unreachable, next connection attempt in %s: %w", wait.Round(time.Millisecond), lastErr)
	}
	var wire *guardedConn
	url, dial, err := e.dialer(&wire)
	var conn *amqp.Connection
	if err == nil {
		conn, err = amqp.DialConfig(url, amqp.Config{Dial: dial, Properties: amqp.Table{"connection_name": e.cfg.Name}})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.failures++
		d := e.cfg.ReconnectMin << min(e.failures-1, 20)
		if d <= 0 || d > e.cfg.ReconnectMax {
			d = e.cfg.ReconnectMax
		}
		d = d/2 + rand.N(d/2+1) //nolint:gosec // jitter needs no crypto
		e.nextDial = time.Now().Add(d)
		e.lastErr = redactErr(err, e.cfg.URL)
		e.logger.Warn("connecting to the broker failed", zap.Error(e.lastErr), zap.Int("failures", e.failures), zap.Duration("retry_in", d))
		return nil, nil, fmt.Errorf("rabbitmq: connect: %w", e.lastErr)
	}
	if e.closed {
		go func() { _ = conn.Close() }()
		return nil, nil, errors.New("rabbitmq: executor closed")
	}
	if e.failures > 0 || e.conn != nil {
		e.logger.Info("reconnected to the broker", zap.Int("failed_attempts", e.failures))
	}
	e.conn, e.wire, e.failures, e.idle = conn, wire, 0, nil
	return conn, wire, nil
}

func (e *Executor) release(ch *channel, reusable bool) {
	if !reusable || ch.ch.IsClosed() {
		discard(ch)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pool(ch)
}

// pool puts ch in the idle pool, unless the executor is closed or has let
// go of ch's connection (a write failed on it, and amqp091-go may not have
// shut it down yet): then it discards ch. e.mu is held.
func (e *Executor) pool(ch *channel) {
	if e.closed || ch.wire != e.wire {
		discard(ch)
		return
	}
	e.idle = append(e.idle, ch)
}

// discard closes a channel that will not be used again, without waiting
// for it. amqp091-go's Channel.Close waits for the broker's close-ok, which
// never comes when the connection dies underneath it (rabbitmq/amqp091-go
// issue 88); the job would hang there past its deadline. A channel already
// closed needs nothing.
func discard(ch *channel) {
	if ch.ch.IsClosed() {
		return
	}
	go func() { _ = ch.ch.Close() }()
}

// Close closes the connection. Jobs executed after it fail. It waits for
// the broker's close-ok at most WriteTimeout: a broker that reads nothing
// (see acquire) never sends it, and its heartbeats keep the connection up.
func (e *Executor) Close() error {
	e.mu.Lock()
	e.closed = true
	e.idle = nil
	conn, wire := e.conn, e.wire
	e.mu.Unlock()
	if conn == nil || conn.IsClosed() {
		return nil
	}
	t := time.AfterFunc(e.cfg.WriteTimeout, func() {
		_ = wire.fail(fmt.Errorf("the broker did not answer the close within %s", e.cfg.WriteTimeout))
	})
	defer t.Stop()
	if err := conn.Close(); err != nil {
		if werr := wire.broken(); werr != nil {
			return fmt.Errorf("rabbitmq: close: %w", werr)
		}
		return fmt.Errorf("rabbitmq: close: %w", err)
	}
	return nil
}

// redactErr keeps the broker's password out of an error that might quote
// the URL.
func redactErr(err error, rawURL string) error {
	uri, perr := amqp.ParseURI(rawURL)
	if perr != nil {
		return err
	}
	return executors.Redact(err, uri.Password)
}

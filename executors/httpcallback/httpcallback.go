// Package httpcallback is the http_callback executor: it sends a request to
// the URL a job's payload names, as the AT Worker did.
//
// The payload is {"url": "...", "data": ...} with optional "method" (POST),
// "headers", "timeout" and "content_type" (application/json). data may be any
// JSON value and is sent as JSON; a JSON string is sent raw.
//
// A 2xx response is done. 408, 425, 429 and 5xx, connection errors and
// timeouts retry; a Retry-After on 429 or 503 sets the next attempt. Any
// other status is a permanent failure. Every request carries an
// Idempotency-Key stable across retries, the job id and the attempt number,
// and, with signing secrets, Standard Webhooks signature headers: one
// signature by each secret in force, the keyring's newest first, then
// SigningSecret's.
//
// Targets can be limited to AllowHosts by name, and are limited to
// AllowNetworks (public addresses unless told otherwise) by the address
// dialled, after DNS resolution, on every connection and every redirect.
// Link-local and cloud metadata addresses are refused unless an allowed
// network lies within them. Redirects are followed only within one host.
// Each host gets at most MaxConnsPerHost requests at once; jobs beyond it
// wait for one, and only jobs for that host wait. With a Breaker, a job
// whose endpoint (scheme, host and port) is open sends nothing and is
// snoozed until the endpoint's cool-down ends, and one whose endpoint is
// disabled sends nothing and is dead (see package endpoints).
//
// Every attempt that sent a request records its result (see
// executors.RecordResult): the status, the time from sending the request to
// the response's headers, and the first bytes of the body, made safe to
// show and masked of the payload's secrets and of what looks like a secret
// (see redact.Reply), as last_error's excerpt of a failing response is.
package httpcallback

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors"
	mask "github.com/pgdispatch/pgdispatch/internal/redact"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
	"github.com/pgdispatch/pgdispatch/signing"
)

// Kind is the job kind this executor runs.
const Kind = "http_callback"

const (
	maxRedirects     = 5
	maxErrorBody     = 512
	maxResultBody    = 256
	maxDrain         = 64 << 10
	maxRetryAfter    = 24 * time.Hour
	defaultUserAgent = "pgdispatch"
	// MaxResponseHeaderBytes bounds the status line and headers of a
	// response; a receiver that sends more fails the attempt.
	MaxResponseHeaderBytes = 64 << 10
	// bodyWait bounds the reading of a response's body once its status is
	// in: the status is the outcome, the body only fills last_error or lets
	// the connection be reused.
	bodyWait = 2 * time.Second
)

// Config configures the executor.
type Config struct {
	// SigningSecret, when set, signs every request per the Standard Webhooks
	// specification. It is base64, optionally prefixed "whsec_".
	SigningSecret string
	// Keyring, when set, holds more secrets: each one in force when a
	// request is sent signs it, before SigningSecret (see package signing).
	Keyring *signing.Keyring
	// AllowHosts, when not empty, limits targets to these hosts: exact names
	// or IPs (IPv6 with or without brackets), or "*.example.com" for any
	// subdomain. It applies to the URL's host; AllowNetworks applies too.
	AllowHosts []string
	// AllowNetworks are the networks whose addresses may be dialled, checked
	// on the address each connection dials, after DNS resolution: CIDRs,
	// single IPs, and the presets NetworksPublic, NetworksPrivate and
	// NetworksLoopback. Link-local and cloud metadata addresses need an
	// entry within them. Default: DefaultAllowNetworks, public only.
	AllowNetworks []string
	// UserAgent is sent with every request. Default: "pgdispatch".
	UserAgent string
	// MaxConnsPerHost bounds the requests in flight to one host (name and
	// port) at once, and so the connections open to it, idle ones included,
	// so that a burst of jobs for one receiver does not open one connection
	// per job. Requests beyond it wait for a connection within their job's
	// timeout; jobs for other hosts do not wait for them. Default:
	// DefaultMaxConnsPerHost.
	MaxConnsPerHost int
	// Breaker, when set, keeps a circuit breaker per endpoint (see package
	// endpoints): a job whose endpoint is open waits, pending, its attempt
	// given back, and every request's outcome is counted. A success is a
	// response that is not 429 or 5xx; a failure is 429, 5xx, no
	// connection (a lookup, connection or TLS handshake that failed), or
	// no response before the job's timeout. A request refused by the
	// rules, cut short by the worker's stop, failed before it reached the
	// network (a header value the client refuses), or timed out under a
	// timeout its payload set shorter than CountedTimeout, counts neither
	// way: a writer's choices cannot open an endpoint that answers. A job whose endpoint is
	// disabled fails, dead, unsent (endpoints.DisabledError). Default: none.
	Breaker *endpoints.Breaker
	// Logger receives a warning, at most once a minute per host, when jobs
	// wait for a host's connections. Default: none.
	Logger *zap.Logger
}

// DefaultMaxConnsPerHost is Config.MaxConnsPerHost's default.
const DefaultMaxConnsPerHost = 32

// Executor sends http_callback jobs. Create it with New; it is safe for
// concurrent use and shares one http.Client with connection reuse. It is a
// prometheus.Collector of its waits for connections.
type Executor struct {
	client    *http.Client
	secret    signing.Secret
	keyring   *signing.Keyring
	guard     *guard
	slots     *hostSlots
	userAgent string
	breaker   *endpoints.Breaker
	logger    *zap.Logger
}

// New checks cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	if cfg.MaxConnsPerHost < 0 {
		return nil, errors.New("http_callback: MaxConnsPerHost must not be negative")
	}
	perHost := cmp.Or(cfg.MaxConnsPerHost, DefaultMaxConnsPerHost)
	g, err := newGuard(cfg.AllowHosts, cfg.AllowNetworks)
	if err != nil {
		return nil, err
	}
	logger := cmp.Or(cfg.Logger, zap.NewNop()).Named("http_callback")
	e := &Executor{
		guard:     g,
		slots:     newHostSlots(perHost, logger),
		breaker:   cfg.Breaker,
		logger:    logger,
		userAgent: cmp.Or(cfg.UserAgent, defaultUserAgent),
		keyring:   cmp.Or(cfg.Keyring, signing.NewKeyring()),
	}
	if cfg.SigningSecret != "" {
		key, err := signing.ParseSecret(cfg.SigningSecret)
		if err != nil {
			return nil, fmt.Errorf("http_callback: %w", err) // never echoes it
		}
		e.secret = key
	}

	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: g.checkDial}
	transport := &http.Transport{
		Proxy:                  nil, // a proxy would dial for us and bypass checkDial
		DialContext:            dialer.DialContext,
		ForceAttemptHTTP2:      true,
		MaxConnsPerHost:        perHost,
		MaxIdleConns:           max(100, perHost),
		MaxIdleConnsPerHost:    perHost, // a connection in use stays open for the next job
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
	}
	e.client = &http.Client{Transport: transport, CheckRedirect: e.checkRedirect}
	return e, nil
}

// refusedError is a target the rules do not allow: permanent.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// redirectError is a redirect to another host, refused: permanent. It
// keeps the Location as the receiver sent it, so that the payload's
// secrets in it are masked as they were sent, before url.URL.String
// encodes them another way.
type redirectError struct {
	from     *url.URL
	location string // as received
	to       *url.URL
}

func (e *redirectError) Error() string { return e.message(nil) }

func (e *redirectError) message(known *mask.Secrets) string {
	to := e.to
	if loc := known.Mask(e.location); loc != e.location {
		if u, err := e.from.Parse(loc); err == nil {
			to = u
		} else {
			to = &url.URL{Scheme: e.to.Scheme, Host: e.to.Host, Path: "/" + mask.Mask}
		}
	}
	return fmt.Sprintf("refused: redirect from %s to another host, %s: only redirects within one host are followed; "+
		"point the job's url at the new location", printable(e.from.Scheme+"://"+e.from.Host), printable(redact(to)))
}

// checkRedirect follows a redirect only within one host (see sameHost), so
// that the payload's headers, its body and the signature never reach a
// host the job did not name.
func (e *Executor) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return &refusedError{fmt.Sprintf("stopped after %d redirects", maxRedirects)}
	}
	if err := e.guard.checkURL(req.URL); err != nil {
		return err
	}
	if from := via[len(via)-1].URL; !sameHost(from, req.URL) {
		var location string
		if req.Response != nil {
			location = req.Response.Header.Get("Location")
		}
		return &redirectError{from: from, location: location, to: req.URL}
	}
	return nil
}

type payload struct {
	URL         string                     `json:"url"`
	Data        json.RawMessage            `json:"data"`
	Method      string                     `json:"method"`
	Headers     map[string]json.RawMessage `json:"headers"`
	Timeout     json.RawMessage            `json:"timeout"` // read by the claimer; checked here
	ContentType string                     `json:"content_type"`
}

var methods = map[string]bool{"GET": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true}

// CountedTimeout is the shortest timeout a payload may set whose end the
// circuit breaker counts as its endpoint's failure: a writer's shorter one
// (a nanosecond) would open an endpoint that answers, and a receiver that
// gives no response within a second or more is failing.
const CountedTimeout = time.Second

// request is a validated payload.
type request struct {
	url         *url.URL
	method      string
	body        []byte
	headers     map[string]string
	contentType string
	// shortTimeout: the payload set the job's timeout below
	// CountedTimeout, which the breaker then does not count (a writer's
	// short one would open an endpoint that answers).
	shortTimeout bool
}

// parse validates a payload. Errors are permanent and name the field.
func parse(raw json.RawMessage) (*request, error) {
	var p payload
	if err := executors.DecodePayload(raw, &p); err != nil {
		return nil, err
	}
	u, err := parseURL(p.URL)
	if err != nil {
		return nil, err
	}
	headers, err := executors.Headers("headers", p.Headers)
	if err != nil {
		return nil, err
	}
	r := &request{url: u, method: "POST", headers: headers, contentType: "application/json"}
	if p.Method != "" {
		r.method = strings.ToUpper(p.Method)
		if !methods[r.method] {
			return nil, executors.Invalid("method", "must be one of GET, POST, PUT, PATCH or DELETE")
		}
	}
	if p.ContentType != "" {
		if strings.ContainsAny(p.ContentType, "\r\n\x00") {
			return nil, executors.Invalid("content_type", "must not contain CR, LF or NUL")
		}
		r.contentType = p.ContentType
	}
	timeout, set, err := executors.PayloadDuration(raw, "timeout")
	if err != nil {
		return nil, executors.Permanent(err)
	}
	r.shortTimeout = set && timeout > 0 && timeout < CountedTimeout
	r.body = executors.Body(p.Data)
	return r, nil
}

// parseURL reads a payload's url.
func parseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, executors.Invalid("url", "is required")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return nil, executors.Invalid("url", "must be an absolute http(s) URL")
	}
	return u, nil
}

// PayloadURL returns the url of an http_callback payload, read as Execute
// reads it: the JSON field matched as encoding/json matches it, the URL
// parsed and checked by the same rules. The payload's other fields are not
// read, so it also takes an object that holds only the url.
func PayloadURL(payload json.RawMessage) (*url.URL, error) {
	var p struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return nil, executors.Invalid("url", "is not a string in a JSON object")
	}
	return parseURL(p.URL)
}

// Validate reports whether payload is a valid http_callback payload.
func Validate(payload json.RawMessage) error {
	_, err := parse(payload)
	return err
}

// Execute implements executors.Executor.
func (e *Executor) Execute(ctx context.Context, job *executors.Job) (err error) {
	r, err := parse(job.Payload)
	if err != nil {
		return err
	}
	target := r.method + " " + redact(r.url)
	if err := e.guard.checkURL(r.url); err != nil {
		return executors.Permanent(fmt.Errorf("%s: %w", target, err))
	}
	if e.breaker == nil {
		_, err := e.send(ctx, job, r, target)
		return err
	}
	endpoint := endpoints.Of(r.url)
	admission := e.breaker.Admit(ctx, endpoint, job.Timeout)
	if admission.Wait > 0 && e.breaker.State(endpoint) == "half_open" && e.breaker.AwaitProbe(ctx, endpoint, probeWait) {
		admission = e.breaker.Admit(ctx, endpoint, job.Timeout)
	}
	if admission.Disabled {
		return executors.Unsent(endpoints.DisabledError(endpoint, admission.DisabledAt))
	}
	if admission.Wait > 0 {
		e.logger.Debug("the job's endpoint is open; the job waits", zap.Int64("job_id", job.ID),
			zap.String("endpoint", endpoint), zap.Duration("wait", admission.Wait))
		if !admission.Until.IsZero() {
			return executors.SnoozeUntil(admission.Until, admission.Wait)
		}
		return executors.Snooze(admission.Wait)
	}
	v, err := e.send(ctx, job, r, target)
	if v == unknown {
		if admission.Probe {
			if gerr := e.breaker.GiveBack(ctx, endpoint, admission); gerr != nil {
				e.logger.Warn("an endpoint's probe that said nothing was not given back; another probe goes after this one's time",
					zap.Int64("job_id", job.ID), zap.String("endpoint", endpoint), zap.Error(gerr))
			}
		}
		return err
	}
	var reason string
	if v == failed {
		reason = err.Error()
	}
	if !admission.Probe {
		e.breaker.Record(endpoint, v == failed, reason)
	} else if perr := e.breaker.ProbeDone(ctx, endpoint, admission, v == failed, reason); perr != nil {
		e.logger.Warn("the outcome of an endpoint's probe was not recorded; another probe goes after this one's time",
			zap.Int64("job_id", job.ID), zap.String("endpoint", endpoint), zap.Error(perr))
	}
	return err
}

// probeWait is how long a job whose endpoint is being probed waits, its
// slot held, for the probe's outcome before it is snoozed: a quick probe's
// success lets it go in its order.
const probeWait = 100 * time.Millisecond

// verdict is what a request says of its endpoint's health.
type verdict int

const (
	unknown verdict = iota // no request, or one the worker cut short
	healthy                // a response other than 429 or 5xx
	failed                 // 429, 5xx, no connection, or no response in time
)

// send sends the request of job, and says what it says of the endpoint.
func (e *Executor) send(ctx context.Context, job *executors.Job, r *request, target string) (v verdict, err error) {
	release, err := e.slots.acquire(ctx, origin(r.url), job.ID)
	if err != nil {
		return unknown, fmt.Errorf("%s: %w", target, err)
	}
	defer release()
	// reqCtx ends the body's reading after bodyWait.
	reqCtx, cancelReq := context.WithCancel(ctx)
	defer cancelReq()
	var sent sendClock
	reqCtx = httptrace.WithClientTrace(reqCtx, &httptrace.ClientTrace{
		WroteHeaders:     sent.start,
		DNSDone:          func(i httptrace.DNSDoneInfo) { sent.failedIf(i.Err) },
		ConnectDone:      func(_, _ string, err error) { sent.failedIf(err) },
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) { sent.failedIf(err) },
	})
	reqCtx, span := tracing.StartClient(reqCtx, trace.SpanKindClient, r.method,
		func() []attribute.KeyValue { return spanAttributes(r.method, r.url) })
	defer func() { tracing.End(span, err) }()
	req, err := http.NewRequestWithContext(reqCtx, r.method, r.url.String(), bytes.NewReader(r.body))
	if err != nil {
		return unknown, executors.Permanent(fmt.Errorf("build request: %w", err))
	}
	for name, value := range r.headers {
		req.Header.Set(name, value)
	}
	if r.body != nil {
		req.Header.Set("Content-Type", r.contentType)
	}
	req.Header.Set("User-Agent", e.userAgent)
	key := idempotencyKey(job.ID)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Pgdispatch-Job-Id", strconv.FormatInt(job.ID, 10))
	req.Header.Set("Pgdispatch-Attempt", strconv.Itoa(job.Attempt))
	if ts, sig := e.signature(key, time.Now(), r.body); sig != "" {
		req.Header.Set("Webhook-Id", key)
		req.Header.Set("Webhook-Timestamp", ts)
		req.Header.Set("Webhook-Signature", sig)
	}
	// The attempt's trace context, over any the payload's headers set; the
	// signature covers the body, not the headers.
	tracing.Inject(reqCtx, propagation.HeaderCarrier(req.Header))

	resp, err := e.client.Do(req)
	took, wasSent := sent.since()
	if err != nil {
		if wasSent {
			_ = executors.RecordResult(ctx, result{DurationMS: ms(took)})
		}
		// A refused redirect quotes the receiver's Location, and the
		// transport a malformed response's first bytes.
		known := mask.NewSecrets(mask.PayloadSecrets(job.Payload)...)
		var (
			refused    *refusedError
			redirected *redirectError
		)
		switch {
		case errors.As(err, &redirected):
			return unknown, executors.Permanent(maskReply(fmt.Errorf("%s: %s", target, redirected.message(known)), known))
		case errors.As(err, &refused):
			return unknown, executors.Permanent(maskReply(fmt.Errorf("%s: %s", target, refused.msg), known))
		}
		if ctx.Err() != nil {
			v = unknown // the worker stopped it, or the payload's own short timeout ended it
			if errors.Is(ctx.Err(), context.DeadlineExceeded) && !r.shortTimeout {
				v = failed
			}
			return v, fmt.Errorf("%s: no response before the job's timeout: %w", target, context.Cause(ctx))
		}
		// A request that failed before it reached the network (a header
		// the client refuses) says nothing of the endpoint.
		v = unknown
		if wasSent || sent.netFailed() {
			v = failed
		}
		return v, maskReply(fmt.Errorf("%s: %w", target, unwrapURLError(err)), known)
	}
	defer func() { _ = resp.Body.Close() }()
	if span != nil {
		span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	}
	stop := time.AfterFunc(bodyWait, cancelReq)
	defer stop.Stop()
	// One read of the body's first bytes serves last_error and the result.
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain)) // lets the connection be reused
	var known *mask.Secrets
	if len(snippet) > 0 {
		known = mask.NewSecrets(mask.PayloadSecrets(job.Payload)...)
	}
	_ = executors.RecordResult(ctx, result{Status: resp.StatusCode, DurationMS: ms(took), Body: bodyExcerpt(snippet, known)})
	v = healthy
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		v = failed
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return v, nil
	}
	return v, classify(target, resp, snippet, known)
}

// spanAttributes are the attributes of a request's client span: the
// method and the origin. The path and query are left out: a webhook's URL
// often holds its secret there (a Slack or Discord hook's path is one).
func spanAttributes(method string, u *url.URL) []attribute.KeyValue {
	host, port, _ := net.SplitHostPort(origin(u))
	p, _ := strconv.Atoi(port)
	return []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(method), semconv.URLScheme(u.Scheme),
		semconv.ServerAddress(host), semconv.ServerPort(p),
	}
}

// result is what an attempt records. Status and Body are left out when
// no response came.
type result struct {
	Status     int     `json:"status,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	Body       string  `json:"body,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// sendClock is when the first request of an attempt (redirects follow it)
// began to be sent, and whether a lookup, connection or TLS handshake
// failed. The transport calls its methods from its own goroutines.
type sendClock struct {
	mu     sync.Mutex
	at     time.Time
	failed bool
}

func (c *sendClock) failedIf(err error) {
	if err != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.failed = true
	}
}

// netFailed reports whether a lookup, connection or TLS handshake failed.
func (c *sendClock) netFailed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

func (c *sendClock) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		c.at = time.Now()
	}
}

// since is the time since the request began to be sent, and whether it was.
func (c *sendClock) since() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return 0, false
	}
	return time.Since(c.at), true
}

// bodyExcerpt is the result's excerpt of the first bytes of a body: masked
// of the payload's secrets and of what looks like a secret (redact.Reply),
// as one printable line, at most maxResultBody bytes. The masking reads
// every byte there is, so that a secret that straddles the cut is masked
// too.
func bodyExcerpt(snippet []byte, known *mask.Secrets) string {
	if len(snippet) == maxErrorBody {
		snippet = cutRune(snippet) // the body goes on
	}
	return strings.TrimSpace(executors.Excerpt(mask.Reply(string(snippet), known), maxResultBody))
}

// cutRune drops a character cut short at the end of b.
func cutRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

// signature is the webhook-timestamp and webhook-signature headers of a
// message sent at now: a Standard Webhooks v1 signature by each secret in
// force, space-separated, the keyring's newest first, then
// SigningSecret's. sig is empty when no secret signs.
func (e *Executor) signature(id string, now time.Time, body []byte) (ts, sig string) {
	secrets := e.keyring.Secrets(now)
	if e.secret != nil {
		secrets = append(secrets, e.secret)
	}
	if len(secrets) == 0 {
		return "", ""
	}
	ts = strconv.FormatInt(now.Unix(), 10)
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		sigs[i] = "v1," + signing.Sign(s, id, ts, body)
	}
	return ts, strings.Join(sigs, " ")
}

func idempotencyKey(jobID int64) string { return "pgdispatch-job-" + strconv.FormatInt(jobID, 10) }

// classify maps a non-2xx response to a retry or a permanent failure. The
// error holds the status and snippet, the first bytes of the body, masked
// as the result's excerpt is.
func classify(target string, resp *http.Response, snippet []byte, known *mask.Secrets) error {
	err := fmt.Errorf("%s: HTTP %s", target, printable(mask.Reply(resp.Status, known)))
	if s := strings.TrimSpace(printable(mask.Reply(string(snippet), known))); s != "" {
		if len(snippet) == maxErrorBody {
			s += "…"
		}
		err = fmt.Errorf("%w: %s", err, s)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return executors.RetryAfter(d, err)
		}
		return err
	case code == http.StatusRequestTimeout || code == http.StatusTooEarly || code >= 500:
		return err
	default:
		return executors.Permanent(err)
	}
}

// maskReply masks an error that quotes what the receiver sent, as the
// result's excerpt is masked.
func maskReply(err error, known *mask.Secrets) error {
	return executors.MaskError(err, func(s string) string { return mask.Reply(s, known) })
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0, false
		}
		return min(time.Duration(secs)*time.Second, maxRetryAfter), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter), true
	}
	return 0, false
}

// redact drops the user info and the query, which may carry secrets, from a
// URL shown in errors, and masks the path's segments that may be
// credentials (see redact.Path).
func redact(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.Fragment = nil, "", ""
	if p := mask.Path(c.Host, c.Path); p != c.Path {
		c.Path, c.RawPath = p, ""
	}
	s := c.String()
	if !utf8.ValidString(s) {
		return c.Host
	}
	return s
}

// unwrapURLError drops url.Error's copy of the URL, which may hold a query.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// printable makes text a receiver sent safe to store and show on one line:
// tabs and line breaks become spaces, and executors.Printable escapes the
// rest.
func printable(s string) string {
	return executors.Printable(lineBreaks.Replace(s))
}

var lineBreaks = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")

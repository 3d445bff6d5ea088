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
// and, with a signing secret, Standard Webhooks signature headers.
//
// Targets can be limited to AllowHosts. Link-local and cloud-metadata
// addresses are refused always, after DNS resolution and on every redirect.
package httpcallback

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/pgdispatch/pgdispatch/executors"
)

// Kind is the job kind this executor runs.
const Kind = "http_callback"

const (
	maxRedirects     = 5
	maxErrorBody     = 512
	maxDrain         = 64 << 10
	maxRetryAfter    = 24 * time.Hour
	defaultUserAgent = "pgdispatch"
)

// Config configures the executor.
type Config struct {
	// SigningSecret, when set, signs every request per the Standard Webhooks
	// specification. It is base64, optionally prefixed "whsec_".
	SigningSecret string
	// AllowHosts, when not empty, limits targets to these hosts: exact names
	// or IPs, or "*.example.com" for any subdomain.
	AllowHosts []string
	// DeniedPrefixes are address ranges never dialled. Default: link-local
	// 169.254.0.0/16 and fe80::/10, and the cloud metadata fd00:ec2::254/128.
	DeniedPrefixes []netip.Prefix
	// UserAgent is sent with every request. Default: "pgdispatch".
	UserAgent string
	// MaxConnsPerHost bounds the connections open to one host at once,
	// idle ones included, so that a burst of jobs for one receiver does not
	// open one connection per job. Requests beyond it wait for a connection
	// within their job's timeout. Default: DefaultMaxConnsPerHost.
	MaxConnsPerHost int
}

// DefaultMaxConnsPerHost is Config.MaxConnsPerHost's default.
const DefaultMaxConnsPerHost = 32

// DefaultDeniedPrefixes are the ranges refused unless Config says otherwise.
var DefaultDeniedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
}

// Executor sends http_callback jobs. Create it with New; it is safe for
// concurrent use and shares one http.Client with connection reuse.
type Executor struct {
	client    *http.Client
	secret    []byte
	allow     []string
	denied    []netip.Prefix
	userAgent string
}

// New checks cfg and returns an Executor.
func New(cfg Config) (*Executor, error) {
	if cfg.MaxConnsPerHost < 0 {
		return nil, errors.New("http_callback: MaxConnsPerHost must not be negative")
	}
	perHost := cmp.Or(cfg.MaxConnsPerHost, DefaultMaxConnsPerHost)
	e := &Executor{
		denied:    cfg.DeniedPrefixes,
		userAgent: cmp.Or(cfg.UserAgent, defaultUserAgent),
	}
	if e.denied == nil {
		e.denied = DefaultDeniedPrefixes
	}
	if cfg.SigningSecret != "" {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(cfg.SigningSecret, "whsec_"))
		if err != nil || len(key) == 0 {
			return nil, errors.New("http_callback: the signing secret must be base64, optionally prefixed whsec_") // never echo it
		}
		e.secret = key
	}
	for _, h := range cfg.AllowHosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" {
			continue
		}
		if strings.Contains(h, "/") || strings.Contains(h, ":") && !isIP(h) {
			return nil, fmt.Errorf("http_callback: allowed host %q: want a host name, an IP or *.domain", h)
		}
		e.allow = append(e.allow, h)
	}

	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: e.checkDial}
	transport := &http.Transport{
		Proxy:                 nil, // a proxy would dial for us and bypass checkDial
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxConnsPerHost:       perHost,
		MaxIdleConns:          max(100, perHost),
		MaxIdleConnsPerHost:   perHost, // a connection in use stays open for the next job
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	e.client = &http.Client{Transport: transport, CheckRedirect: e.checkRedirect}
	return e, nil
}

func isIP(h string) bool {
	_, err := netip.ParseAddr(strings.Trim(h, "[]"))
	return err == nil
}

// refusedError is a target the rules do not allow: permanent.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// checkDial runs after DNS resolution, for every address dialled, including
// on redirects.
func (e *Executor) checkDial(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return &refusedError{"refused: unparsable address " + address}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return &refusedError{"refused: unparsable address " + address}
	}
	ip = ip.Unmap()
	for _, p := range e.denied {
		if p.Contains(ip) {
			return &refusedError{fmt.Sprintf("refused: %s is in the denied range %s (link-local or cloud metadata)", ip, p)}
		}
	}
	return nil
}

func (e *Executor) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return &refusedError{fmt.Sprintf("stopped after %d redirects", maxRedirects)}
	}
	return e.checkHost(req.URL)
}

func (e *Executor) checkHost(u *url.URL) error {
	if len(e.allow) == 0 {
		return nil
	}
	host := strings.ToLower(u.Hostname())
	for _, a := range e.allow {
		if a == host || strings.HasPrefix(a, "*.") && strings.HasSuffix(host, a[1:]) {
			return nil
		}
	}
	return &refusedError{fmt.Sprintf("refused: host %q is not in HTTP_ALLOW_HOSTS", host)}
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

// request is a validated payload.
type request struct {
	url         *url.URL
	method      string
	body        []byte
	headers     map[string]string
	contentType string
}

// parse validates a payload. Errors are permanent and name the field.
func parse(raw json.RawMessage) (*request, error) {
	var p payload
	if err := executors.DecodePayload(raw, &p); err != nil {
		return nil, err
	}
	if p.URL == "" {
		return nil, executors.Invalid("url", "is required")
	}
	u, err := url.Parse(p.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return nil, executors.Invalid("url", "must be an absolute http(s) URL")
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
	if _, _, err := executors.PayloadDuration(raw, "timeout"); err != nil {
		return nil, executors.Permanent(err)
	}
	r.body = executors.Body(p.Data)
	return r, nil
}

// Validate reports whether payload is a valid http_callback payload.
func Validate(payload json.RawMessage) error {
	_, err := parse(payload)
	return err
}

// Execute implements executors.Executor.
func (e *Executor) Execute(ctx context.Context, job *executors.Job) error {
	r, err := parse(job.Payload)
	if err != nil {
		return err
	}
	if err := e.checkHost(r.url); err != nil {
		return executors.Permanent(err)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, r.url.String(), bytes.NewReader(r.body))
	if err != nil {
		return executors.Permanent(fmt.Errorf("build request: %w", err))
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
	if e.secret != nil {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		req.Header.Set("Webhook-Id", key)
		req.Header.Set("Webhook-Timestamp", ts)
		req.Header.Set("Webhook-Signature", "v1,"+e.sign(key, ts, r.body))
	}

	target := r.method + " " + redact(r.url)
	resp, err := e.client.Do(req)
	if err != nil {
		var refused *refusedError
		if errors.As(err, &refused) {
			return executors.Permanent(fmt.Errorf("%s: %s", target, refused.msg))
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: no response before the job's timeout: %w", target, context.Cause(ctx))
		}
		return fmt.Errorf("%s: %w", target, unwrapURLError(err))
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain)) // lets the connection be reused
		return nil
	}
	return classify(target, resp)
}

// sign is the Standard Webhooks v1 signature: base64 of
// HMAC-SHA256(secret, id.timestamp.body).
func (e *Executor) sign(id, ts string, body []byte) string {
	mac := hmac.New(sha256.New, e.secret)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func idempotencyKey(jobID int64) string { return "pgdispatch-job-" + strconv.FormatInt(jobID, 10) }

// classify maps a non-2xx response to a retry or a permanent failure. The
// error holds the status and the first bytes of the body.
func classify(target string, resp *http.Response) error {
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	err := fmt.Errorf("%s: HTTP %s", target, resp.Status)
	if s := strings.TrimSpace(strings.ToValidUTF8(string(snippet), "\uFFFD")); s != "" {
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
// URL shown in errors.
func redact(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.Fragment = nil, "", ""
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

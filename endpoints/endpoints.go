// Package endpoints keeps a circuit breaker per receiver of http_callback
// jobs, in the schema's endpoints table, so that every worker sees the same
// state and it outlives a restart.
//
// An endpoint is a URL's scheme, host and port (Of). The executor asks
// Admit before each request: a closed endpoint's request goes; an open
// one's job waits, pending, without spending an attempt, until the
// endpoint's cool-down ends; then exactly one job, the probe, takes the
// endpoint half-open (a compare-and-set in SQL) and goes, and the others
// wait until the probe ends. The probe's outcome closes the circuit, or
// opens it again with the cool-down doubled (ProbeDone); a probe whose
// request said nothing of the endpoint is given back (GiveBack). The jobs
// that wait for one cool-down or one probe wait for the same instant
// (Admission.Until), so that they go in their order.
//
// The outcomes of the requests of a closed endpoint are counted in memory
// (Record) and written every FlushInterval in one statement,
// record_endpoint_outcomes (migration 019), which opens an endpoint whose
// failures reach FailureRatio of at least MinAttempts attempts in a Window.
// Every change of state is told on the channel pgdispatch.control; a
// Breaker reads the endpoints that are not closed when it starts, when
// woken (Wake: a notification, a listener that connected again) and, while
// it knows of one open or half-open, every RefreshInterval.
//
// An endpoint open for longer than DisableAfter is disabled at its next
// failed probe, and an operator may disable one (disable_endpoint,
// migration 020): a disabled endpoint takes no probe and its jobs fail,
// dead, with a last_error that says how to enable it and retry them. An
// endpoint that opens from closed, closes, is disabled or enabled is an
// event: a row of endpoint_events written with the change (and, with
// EventKind, a job that tells of it), which one worker's Breaker logs and
// counts when it reads the endpoints (Report).
package endpoints

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/idna"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/stmttimeout"
)

// The breaker's defaults.
const (
	// DefaultWindow is the span over which outcomes are counted.
	DefaultWindow = time.Minute
	// DefaultMinAttempts is the fewest attempts in a window that can open
	// the circuit.
	DefaultMinAttempts = 20
	// DefaultFailureRatio is the share of failed attempts that opens it.
	DefaultFailureRatio = 0.5
	// DefaultCoolDown is how long it stays open first.
	DefaultCoolDown = 30 * time.Second
	// DefaultMaxCoolDown caps the cool-down, which doubles at each failed
	// probe.
	DefaultMaxCoolDown = 10 * time.Minute
	// DefaultFlushInterval is how often the counted outcomes are written.
	DefaultFlushInterval = time.Second
	// DefaultDisableAfter is how long an endpoint stays open, its
	// probes failing, before it is disabled: as long as Svix waits, so
	// that a receiver down over a long weekend is not disabled.
	DefaultDisableAfter = 5 * 24 * time.Hour
	// DefaultRefreshInterval is how often the endpoints that are not
	// closed are read while the breaker knows of one open or half-open,
	// besides when a change is notified.
	DefaultRefreshInterval = 5 * time.Second
)

const (
	// MaxReason bounds the reason stored, in characters.
	MaxReason = 300
	// minWait is the least a job waits: a probe claimed at the same
	// moment by another worker leaves no time to wait for.
	minWait = time.Second
	// finalFlushTimeout bounds the last write at shutdown.
	finalFlushTimeout = 5 * time.Second
)

// DB runs the breaker's statements: a pool.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Breaker. A zero value means the default.
type Config struct {
	// DB reads and writes the endpoints table. Required.
	DB DB
	// Schema holds the table. Required.
	Schema string
	// Window, MinAttempts and FailureRatio: a closed endpoint opens when,
	// in a window of Window, at least MinAttempts attempts were made and
	// FailureRatio of them (0 < r ≤ 1) failed.
	Window       time.Duration
	MinAttempts  int
	FailureRatio float64
	// CoolDown is how long an endpoint stays open when it opens; each
	// failed probe doubles it, up to MaxCoolDown. One that opens again
	// within MaxCoolDown of a probe closing it opens for twice its last
	// cool-down, up to MaxCoolDown.
	CoolDown, MaxCoolDown time.Duration
	// FlushInterval is how often the outcomes counted are written, and
	// RefreshInterval how often the endpoints that are not closed are read
	// without a notification, while one is open or half-open.
	FlushInterval, RefreshInterval time.Duration
	// DisableAfter is how long an endpoint may stay open: the first
	// probe that fails after it disables the endpoint. Below 0: never.
	DisableAfter time.Duration
	// EventKind, when set, makes each event of an endpoint this breaker
	// records (opened, closed, disabled) insert a job of that kind in
	// EventQueue ("default" when empty), with EventPayload (a JSON object;
	// {} when empty) and the event in it (see endpoint_event, migration
	// 020), in the transaction that changes the endpoint.
	EventKind, EventQueue string
	EventPayload          json.RawMessage
	// StatementTimeout bounds each statement. Default: 10s.
	StatementTimeout time.Duration
	// Logger receives the changes of state and the failures to write or
	// read. Default: none.
	Logger *zap.Logger
}

// Breaker is the circuit breakers of a schema's endpoints, as one worker
// sees them. It is safe for concurrent use; run it with Run.
type Breaker struct {
	cfg    Config
	logger *zap.Logger
	wake   chan struct{}
	sql    statements

	mu      sync.Mutex
	counts  map[string]*tally    // outcomes not yet written
	open    map[string]gate      // the endpoints not closed, as last read
	slow    map[string]time.Time // the hold of each endpoint's last probe that a job waited for in vain
	changed chan struct{}        // closed at the next change of open

	events *prometheus.CounterVec // the events reported, by event and actor
}

// tally is an endpoint's outcomes since the last write.
type tally struct {
	attempts, failures int32
	reason             string
}

// gate is an endpoint that is not closed: its jobs wait until until
// (local time), then one of them tries to take the probe; hold, when set,
// is that instant as the table says it (holdSQL), on the database's clock.
// Or a disabled one, whose jobs fail.
type gate struct {
	state       string
	until, hold time.Time
	disabled    bool
}

// New checks cfg and returns a Breaker.
func New(cfg Config) (*Breaker, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("endpoints: DB is required")
	case cfg.Schema == "":
		return nil, errors.New("endpoints: Schema is required")
	case cfg.FailureRatio < 0 || cfg.FailureRatio > 1:
		return nil, errors.New("endpoints: FailureRatio must be within 0 and 1")
	case len(cfg.EventPayload) > 0 && !isObject(cfg.EventPayload):
		return nil, errors.New("endpoints: EventPayload must be a JSON object")
	case cfg.Window < 0 || cfg.MinAttempts < 0 || cfg.CoolDown < 0 || cfg.MaxCoolDown < 0 ||
		cfg.FlushInterval < 0 || cfg.RefreshInterval < 0:
		return nil, errors.New("endpoints: durations and MinAttempts must not be negative")
	}
	cfg.Window = cmp.Or(cfg.Window, DefaultWindow)
	cfg.MinAttempts = cmp.Or(cfg.MinAttempts, DefaultMinAttempts)
	cfg.FailureRatio = cmp.Or(cfg.FailureRatio, DefaultFailureRatio)
	cfg.CoolDown = cmp.Or(cfg.CoolDown, DefaultCoolDown)
	cfg.MaxCoolDown = max(cmp.Or(cfg.MaxCoolDown, DefaultMaxCoolDown), cfg.CoolDown)
	cfg.FlushInterval = cmp.Or(cfg.FlushInterval, DefaultFlushInterval)
	cfg.RefreshInterval = cmp.Or(cfg.RefreshInterval, DefaultRefreshInterval)
	cfg.DisableAfter = cmp.Or(cfg.DisableAfter, DefaultDisableAfter)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, stmttimeout.Default)
	b := &Breaker{
		cfg: cfg, logger: cmp.Or(cfg.Logger, zap.NewNop()).Named("endpoints"), wake: make(chan struct{}, 1),
		sql: newStatements(cfg.Schema), counts: map[string]*tally{}, open: map[string]gate{}, slow: map[string]time.Time{},
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgdispatch", Name: "endpoint_events_total",
			Help: "Events of the endpoints' circuits (opened, closed, disabled, enabled), by event and by whom (breaker or operator), " +
				"each counted by the one worker that logged it.",
		}, []string{"event", "by"}),
	}
	for _, l := range [][2]string{{"opened", "breaker"}, {"closed", "breaker"}, {"disabled", "breaker"}, {"disabled", "operator"}, {"enabled", "operator"}} {
		b.events.WithLabelValues(l[0], l[1])
	}
	return b, nil
}

// isObject reports whether j is a JSON object.
func isObject(j json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(j, &m) == nil && m != nil
}

// Describe implements prometheus.Collector.
func (b *Breaker) Describe(ch chan<- *prometheus.Desc) { b.events.Describe(ch) }

// Collect implements prometheus.Collector: the events this worker
// reported. They carry no endpoint label, because endpoints come from
// untrusted payloads; the log lines name them.
func (b *Breaker) Collect(ch chan<- prometheus.Metric) { b.events.Collect(ch) }

// MaxEndpoint is the longest endpoint the endpoints table holds, in
// bytes: the outcomes of longer ones, which a writer's URL can make, are
// not counted.
const MaxEndpoint = 300

// Of is the endpoint of a URL: its scheme, host and port as HostPort gives
// them (https://example.com:443). It holds no user info, path or query.
// The URLs that the HTTP client sends to the same host and port have the
// same endpoint, so that a writer cannot send to a disabled endpoint by
// spelling its URL another way.
func Of(u *url.URL) string {
	host, port := HostPort(u)
	return strings.ToLower(u.Scheme) + "://" + net.JoinHostPort(host, port)
}

// HostPort is a URL's host and port as its endpoint names them: the host
// as Host gives it, the port without leading zeros (the client dials
// :0443 as :443), the scheme's default when the URL has none.
func HostPort(u *url.URL) (host, port string) {
	port = u.Port()
	if n, err := strconv.ParseUint(port, 10, 64); err == nil {
		port = strconv.FormatUint(n, 10)
	} else if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return Host(u.Hostname()), port
}

// Host is a URL's host (url.URL.Hostname) as its endpoint names it:
// without a trailing dot; an IP address in its canonical form, an
// IPv4-mapped IPv6 address as the IPv4 address the client dials; a name in
// lowercase ASCII, an internationalised one in the punycode the client
// looks up.
func Host(h string) string {
	h = strings.TrimSuffix(h, ".")
	if ip, err := netip.ParseAddr(h); err == nil {
		return ip.Unmap().String()
	}
	for _, r := range h {
		if r >= utf8.RuneSelf { // as net/http's idnaASCII: an ASCII name is dialed as it is
			if a, err := idna.Lookup.ToASCII(h); err == nil {
				h = a
			}
			break
		}
	}
	return strings.ToLower(h)
}

// Admission is what Admit decides for a request.
type Admission struct {
	// Wait, when above 0, is how long the job waits before it asks again:
	// the endpoint is open, or another job probes it.
	Wait time.Duration
	// Until, when set, is the instant the wait ends, on the database's
	// clock: the same for every job that waits for one cool-down or one
	// probe, so that they are due together and go in their order (snooze
	// the job until it: executors.SnoozeUntil).
	Until time.Time
	// Probe says the request is the endpoint's probe: report its outcome
	// with ProbeDone, not Record.
	Probe bool
	// probeUntil names the probe: its probe_until, as taken.
	probeUntil time.Time
	// Disabled says the endpoint is disabled: the job is not sent, and
	// fails (see DisabledError); DisabledAt is when it was disabled.
	Disabled   bool
	DisabledAt time.Time
}

// DisabledError is the failure of a job whose endpoint is disabled, since
// disabledAt: it says how to enable the endpoint and run again the jobs
// that died since then, and not those of the host that died before, of
// another failure.
func DisabledError(endpoint string, disabledAt time.Time) error {
	return fmt.Errorf("endpoint %s is disabled: its jobs are not sent. Once its receiver works, run "+
		"'pgdispatch endpoints enable %s', then '%s --since %s --yes' "+
		"to send the jobs that died meanwhile", endpoint, ShellArg(endpoint), RetryCommand(endpoint),
		disabledAt.UTC().Format(time.RFC3339Nano))
}

// RetryCommand is the command that counts endpoint's dead jobs, those
// of its host and port (--yes retries them): pgdispatch jobs retry
// --all-dead --host H.
func RetryCommand(endpoint string) string {
	host := endpoint
	if _, rest, ok := strings.Cut(endpoint, "://"); ok {
		host = rest
	}
	return "pgdispatch jobs retry --all-dead --host " + ShellArg(host)
}

// shellPlain is a word a POSIX shell reads as it is.
var shellPlain = regexp.MustCompile(`^[A-Za-z0-9._:@%+=,/-]+$`)

// ShellArg is a word of a shell command, an endpoint or its host:port
// among others: as it is when a shell reads it so; an IPv6 address's
// brackets, which a shell reads as a glob (zsh refuses one that matches no
// file), in double quotes; and anything else a shell acts on ($, ;, ( and
// ' among them, which a URL's host may hold) in single quotes, where a
// single quote is closed, escaped and opened again:
//
//	a'b → 'a'\''b'
func ShellArg(s string) string {
	switch {
	case shellPlain.MatchString(s):
		return s
	case shellPlain.MatchString(strings.NewReplacer("[", "", "]", "").Replace(s)):
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Admit says whether a request to endpoint may go. A request to a closed
// endpoint goes; one to an open endpoint waits until its cool-down ends;
// after it, the first to ask takes the probe for probeFor (its timeout),
// and the others wait for the probe. A probe that was not reported within
// probeFor is given to the next to ask. When the table cannot be read, the
// job waits RefreshInterval. A request to an endpoint the table says is
// disabled does not go (Disabled).
func (b *Breaker) Admit(ctx context.Context, endpoint string, probeFor time.Duration) Admission {
	b.mu.Lock()
	g, ok := b.open[endpoint]
	b.mu.Unlock()
	if !ok {
		return Admission{}
	}
	// A disabled endpoint is read again: its job is made dead only by
	// what the table says, not by a read that an operator's enable has
	// not reached yet.
	if wait := time.Until(g.until); wait > 0 && !g.disabled {
		return Admission{Wait: max(wait, minWait), Until: g.hold}
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StatementTimeout)
	defer cancel()
	var (
		probe                  bool
		state                  *string
		left                   *float64
		disabledAt, probeUntil *time.Time
		hold                   *time.Time
		err                    error
	)
	// A probe taken by another job while the statement waited for the
	// row leaves it reading the row as it was: over (left ≤ 0), yet not
	// taken. The next statement reads the row as it is.
	for range 2 {
		err = b.cfg.DB.QueryRow(ctx, b.sql.probe, endpoint, probeFor.Seconds(), b.cfg.CoolDown.Seconds()).Scan(
			&probe, &state, &left, &disabledAt, &probeUntil, &hold)
		if err != nil || probe || disabledAt != nil || left == nil || *left > 0 {
			break
		}
	}
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			b.set(endpoint, "", 0, nil)
			return Admission{}
		}
		b.logger.Warn("taking the probe of an open endpoint failed; its job waits", zap.String("endpoint", endpoint),
			zap.Error(describe(err)), zap.Duration("wait", b.cfg.RefreshInterval))
		return Admission{Wait: b.cfg.RefreshInterval}
	}
	switch {
	case disabledAt != nil:
		b.setDisabled(endpoint, *state)
		return Admission{Disabled: true, DisabledAt: *disabledAt}
	case probe:
		b.set(endpoint, "half_open", b.wait("half_open", probeFor), hold)
		b.logger.Info("probing an open endpoint", zap.String("endpoint", endpoint))
		return Admission{Probe: true, probeUntil: *probeUntil}
	case state == nil || *state == "closed":
		b.set(endpoint, "", 0, nil)
		return Admission{}
	default:
		wait := b.wait(*state, seconds(left))
		b.set(endpoint, *state, wait, hold)
		return Admission{Wait: wait, Until: deref(hold)}
	}
}

// Record counts the outcome of a request to endpoint that was not a
// probe; reason is a failure's text, already redacted.
func (b *Breaker) Record(endpoint string, failed bool, reason string) {
	if len(endpoint) > MaxEndpoint {
		return // the table cannot hold it, and its flush would fail every other endpoint's
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.counts[endpoint]
	if t == nil {
		t = &tally{}
		b.counts[endpoint] = t
	}
	t.attempts++
	if failed {
		t.failures++
		t.reason = reason
	}
}

// ProbeDone reports the outcome of endpoint's probe, which Admit gave as
// probe: a success closes the circuit, a failure opens it again with the
// cool-down doubled, up to MaxCoolDown, or disables the endpoint once it
// has been open for DisableAfter. A probe that is no longer the
// endpoint's (it took longer than its probeFor and another was taken, or
// the endpoint was disabled) changes nothing.
func (b *Breaker) ProbeDone(ctx context.Context, endpoint string, probe Admission, failed bool, reason string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.StatementTimeout)
	defer cancel()
	var (
		left     *float64
		hold     *time.Time
		disabled bool
		err      error
	)
	if failed {
		err = b.cfg.DB.QueryRow(ctx, b.sql.reopen, endpoint, excerpt(reason), b.cfg.CoolDown.Seconds(),
			b.cfg.MaxCoolDown.Seconds(), b.cfg.Schema, b.disableAfter(), b.eventKind(), b.eventQueue(),
			b.eventPayload(), probe.probeUntil).Scan(&left, &hold, &disabled)
	} else {
		err = b.cfg.DB.QueryRow(ctx, b.sql.close, endpoint, b.eventKind(), b.eventQueue(), b.eventPayload(),
			probe.probeUntil, b.cfg.MaxCoolDown.Seconds(), b.cfg.CoolDown.Seconds()).Scan(&left, &hold)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("record the probe of %s: %w", endpoint, describe(err))
	}
	switch {
	case disabled:
		b.setDisabled(endpoint, "open")
	case failed:
		b.set(endpoint, "open", seconds(left), hold)
		b.logger.Warn("endpoint open again: its probe failed", zap.String("endpoint", endpoint),
			zap.Duration("cool_down", seconds(left)), zap.String("reason", excerpt(reason)))
	default:
		b.set(endpoint, "", 0, nil)
	}
	return nil
}

// disableAfter is DisableAfter in seconds for the statements, 0 for
// never.
func (b *Breaker) disableAfter() float64 { return max(b.cfg.DisableAfter.Seconds(), 0) }

// eventKind is EventKind for the statements: NULL when empty.
func (b *Breaker) eventKind() *string {
	if b.cfg.EventKind == "" {
		return nil
	}
	return &b.cfg.EventKind
}

// eventQueue is EventQueue for the statements: NULL when empty.
func (b *Breaker) eventQueue() *string {
	if b.cfg.EventQueue == "" {
		return nil
	}
	return &b.cfg.EventQueue
}

// eventPayload is EventPayload for the statements: NULL when empty.
func (b *Breaker) eventPayload() *string {
	if len(b.cfg.EventPayload) == 0 {
		return nil
	}
	s := string(b.cfg.EventPayload)
	return &s
}

// GiveBack gives back endpoint's probe, which Admit gave as probe, when
// its request said nothing of the endpoint (the job was cancelled, the
// worker stopped it, it failed before it reached the network): the next
// job to ask, on any worker, takes the probe at once, rather than after
// this one's probeFor. A probe that is no longer the endpoint's changes
// nothing.
func (b *Breaker) GiveBack(ctx context.Context, endpoint string, probe Admission) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.StatementTimeout)
	defer cancel()
	var none *float64
	err := b.cfg.DB.QueryRow(ctx, b.sql.giveBack, endpoint, b.cfg.Schema, probe.probeUntil).Scan(&none)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("give back the probe of %s: %w", endpoint, describe(err))
	}
	b.set(endpoint, "half_open", 0, nil)
	return nil
}

// wait is how long a job waits for an endpoint in state that holds for
// left: until an open endpoint's cool-down ends, and at most CoolDown for
// a probe, so that a probe's success lets the backlog go within CoolDown
// however long the probe's timeout.
func (b *Breaker) wait(state string, left time.Duration) time.Duration {
	if state == "half_open" {
		left = min(left, b.cfg.CoolDown)
	}
	return max(left, minWait)
}

// set notes endpoint's state: closed when state is "", else until wait
// from now, hold on the database's clock (nil: unknown).
func (b *Breaker) set(endpoint, state string, wait time.Duration, hold *time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, had := b.open[endpoint]
	if state == "" {
		delete(b.open, endpoint)
		delete(b.slow, endpoint)
	} else {
		b.open[endpoint] = gate{state: state, until: time.Now().Add(wait), hold: deref(hold)}
	}
	if had != (state != "") || old.state != state || old.disabled {
		b.notify()
	}
}

// setDisabled notes that endpoint, in state, is disabled.
func (b *Breaker) setDisabled(endpoint, state string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, had := b.open[endpoint]
	b.open[endpoint] = gate{state: state, disabled: true}
	if !had || !old.disabled {
		b.notify()
	}
}

// notify closes the changed channel; under mu.
func (b *Breaker) notify() {
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}

// Changed returns a channel closed at the next change of the endpoints
// this worker knows are not closed.
func (b *Breaker) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	return b.changed
}

// AwaitProbe waits, at most for d, until this worker knows endpoint out of
// half_open: the outcome of its probe, when it is quick, lets the jobs
// that asked while it went go in their order, rather than a probe's wait
// after the jobs asked later. Once a wait for a probe ran out, the others
// for it return at once: a slow probe holds a batch of slots for d, not
// every job of the backlog. It says whether the state changed.
func (b *Breaker) AwaitProbe(ctx context.Context, endpoint string, d time.Duration) bool {
	b.mu.Lock()
	probe := b.open[endpoint].hold
	waited, ok := b.slow[endpoint]
	slow := ok && waited.Equal(probe)
	b.mu.Unlock()
	if slow {
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		changed := b.Changed()
		if b.State(endpoint) != "half_open" {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			b.mu.Lock()
			b.slow[endpoint] = probe
			b.mu.Unlock()
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// State is the state this worker knows endpoint in: "closed", "open" or
// "half_open", or "disabled".
func (b *Breaker) State(endpoint string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g, ok := b.open[endpoint]; ok {
		if g.disabled {
			return "disabled"
		}
		return g.state
	}
	return "closed"
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func seconds(s *float64) time.Duration {
	if s == nil {
		return 0
	}
	return time.Duration(*s * float64(time.Second))
}

// excerpt makes a reason printable (executors.Printable: a receiver's
// bytes that an error quotes raw, a NUL among them, would fail the write
// of every endpoint's outcomes) and bounds it to MaxReason characters.
func excerpt(s string) string {
	s = executors.Printable(s)
	if r := []rune(s); len(r) > MaxReason {
		return string(r[:MaxReason-1]) + "…"
	}
	return s
}

// describe says what to do about a role that may not use the table.
func describe(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("%w (grant the worker's role its rights on endpoints: run docs/roles.sql again)", err)
	}
	return err
}

// sortedKeys is m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

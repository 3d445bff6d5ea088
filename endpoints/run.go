package endpoints

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// statements are the breaker's SQL, for one schema.
type statements struct {
	probe, close, reopen, giveBack, load, flush, report string
}

// notifyFrom tells the workers, once per row of u, that an endpoint
// changed: as record_endpoint_outcomes does.
const notifyFrom = ` FROM u, LATERAL pg_catalog.pg_notify('pgdispatch.control',
    pg_catalog.jsonb_build_object('schema', $%d::text, 'endpoints', true, 'endpoint', u.endpoint)::text) AS n`

// holdSQL is the instant the jobs of a row that is not closed wait for,
// given the cool-down in seconds: an open one's open_until; a half-open
// one's, a second (for the probe to report) after probe_until, but at
// most after a cool-down past open_until, so that a probe's success lets
// the backlog go soon however long the probe's timeout (from now, for a
// probe taken a cool-down late); NULL when it is past. Every job that
// waits for one cool-down or one probe waits for the same instant, so that
// they are due together and claimed in their order.
const holdSQL = `nullif(greatest(CASE %[1]sstate WHEN 'open' THEN %[1]sopen_until ELSE greatest(least(%[1]sprobe_until,
    %[1]sopen_until + make_interval(secs => %[2]s)), now()) + interval '1 second' END, now()), now())`

func newStatements(schema string) statements {
	t := pgx.Identifier{schema, "endpoints"}.Sanitize()
	events := pgx.Identifier{schema, "endpoint_events"}.Sanitize()
	event := pgx.Identifier{schema, "endpoint_event"}.Sanitize()
	return statements{
		// probe takes the probe of $1 for $2 seconds, when its cool-down
		// or the last probe's time is over and it is not disabled, and
		// says the state it found, for how long it holds, when the
		// endpoint was disabled (NULL: it is not), the probe_until that
		// names the probe it took, and the instant the others wait for
		// (holdSQL, the cool-down $3 seconds).
		probe: `WITH p AS (
    UPDATE ` + t + ` SET state = 'half_open', probe_until = now() + make_interval(secs => $2), updated_at = now()
    WHERE endpoint = $1 AND disabled_at IS NULL
      AND ((state = 'open' AND open_until <= now()) OR (state = 'half_open' AND probe_until <= now()))
    RETURNING probe_until, ` + fmt.Sprintf(holdSQL, "", "$3") + ` AS hold)
SELECT EXISTS (SELECT FROM p), e.state,
       extract(epoch FROM CASE e.state WHEN 'open' THEN e.open_until WHEN 'half_open' THEN e.probe_until END - now())::float8,
       e.disabled_at, (SELECT probe_until FROM p),
       coalesce((SELECT hold FROM p), CASE WHEN e.state <> 'closed' THEN ` + fmt.Sprintf(holdSQL, "e.", "$3") + ` END)
FROM ` + t + ` e WHERE e.endpoint = $1`,
		// close closes $1 and records the event, its job of kind $2 in
		// queue $3 with payload $4 (endpoint_event tells the workers). It
		// keeps the cool-down ($7 seconds when none), doubled up to $6
		// seconds, for $6 seconds: an endpoint that opens again by then
		// opens for it, within the opener's settings (migrations 022 and
		// 024), so that one that keeps failing soon after its probes
		// succeed opens for longer each time.
		close: `WITH u AS (
    UPDATE ` + t + ` SET state = 'closed', attempts = 0, failures = 0, window_started_at = now(), opened_at = NULL,
        open_until = NULL, probe_until = NULL, updated_at = now(),
        cool_down = least(coalesce(cool_down, make_interval(secs => $7)) * 2, make_interval(secs => $6)), cool_down_kept_until = now() + make_interval(secs => $6)
    WHERE endpoint = $1 AND state = 'half_open' AND disabled_at IS NULL AND probe_until = $5
    RETURNING endpoint)
SELECT NULL::float8, NULL::timestamptz FROM u, LATERAL ` + event + `(u.endpoint, 'closed', 'breaker', NULL, NULL, $2, $3, $4::jsonb) AS ev`,
		// reopen doubles the cool-down ($3 seconds when none), up to $4;
		// an endpoint open for $6 seconds or more (0: never) is disabled
		// instead, an event whose job is of kind $7 in queue $8 with
		// payload $9. It opens the endpoint at least until the jobs held
		// by the probe are due (holdSQL), so that they are held again with
		// the jobs held since, until the same instant. close and reopen end
		// the probe named by its probe_until ($5, $10): a late outcome of
		// another changes nothing.
		reopen: `WITH u AS (
    UPDATE ` + t + ` SET state = 'open',
        cool_down = least(coalesce(cool_down, make_interval(secs => $3)) * 2, make_interval(secs => $4)),
        open_until = greatest(now() + least(coalesce(cool_down, make_interval(secs => $3)) * 2, make_interval(secs => $4)),
            least(probe_until, open_until + make_interval(secs => $3)) + interval '1 second'),
        probe_until = NULL, reason = $2, updated_at = now(),
        disabled_at = CASE WHEN $6::float8 > 0 AND opened_at <= now() - make_interval(secs => $6::float8) THEN now() END,
        disabled_by = CASE WHEN $6::float8 > 0 AND opened_at <= now() - make_interval(secs => $6::float8) THEN 'breaker' END
    WHERE endpoint = $1 AND state = 'half_open' AND disabled_at IS NULL AND probe_until = $10
    RETURNING endpoint, extract(epoch FROM open_until - now())::float8 AS left_secs, open_until,
        disabled_at IS NOT NULL AS disabled, reason)
SELECT u.left_secs, u.open_until, u.disabled` + fmt.Sprintf(notifyFrom, 5) + `,
    LATERAL (SELECT CASE WHEN u.disabled
        THEN ` + event + `(u.endpoint, 'disabled', 'breaker', u.reason, NULL, $7, $8, $9::jsonb) END) AS ev`,
		// giveBack ends the probe named by its probe_until ($3) without
		// an outcome: the next to ask takes the probe.
		giveBack: `WITH u AS (
    UPDATE ` + t + ` SET probe_until = now(), updated_at = now()
    WHERE endpoint = $1 AND state = 'half_open' AND probe_until = $3
    RETURNING endpoint)
SELECT NULL::float8` + fmt.Sprintf(notifyFrom, 2),
		load: `SELECT endpoint, state,
       greatest(extract(epoch FROM CASE state WHEN 'open' THEN open_until ELSE probe_until END - now()), 0)::float8,
       disabled_at IS NOT NULL, ` + fmt.Sprintf(holdSQL, "", "$1") + `
FROM ` + t + ` WHERE state <> 'closed' OR disabled_at IS NOT NULL ORDER BY endpoint`,
		flush: `SELECT e FROM ` + pgx.Identifier{schema, "record_endpoint_outcomes"}.Sanitize() + `($1, $2, $3, $4,
    make_interval(secs => $5), $6, $7, make_interval(secs => $8), $9, $10, $11::jsonb, make_interval(secs => $12)) AS e`,
		// report takes the events no worker has reported, oldest first,
		// up to $1 of them, those another worker takes skipped.
		report: `WITH r AS (
    SELECT id FROM ` + events + ` WHERE reported_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
UPDATE ` + events + ` x SET reported_at = now() FROM r WHERE x.id = r.id
RETURNING x.id, x.endpoint, x.event, x.at, x.actor, x.by_role, coalesce(x.reason, ''), coalesce(x.note, ''), x.job_id`,
	}
}

// Wake asks for a read of the endpoints that are not closed. It does not
// block.
func (b *Breaker) Wake() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// Load reads the endpoints that are not closed.
func (b *Breaker) Load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StatementTimeout)
	defer cancel()
	type row struct {
		endpoint, state string
		left            float64
		disabled        bool
		hold            *time.Time
	}
	rows, _ := b.cfg.DB.Query(ctx, b.sql.load, b.cfg.CoolDown.Seconds())
	read, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.endpoint, &x.state, &x.left, &x.disabled, &x.hold)
	})
	if err != nil {
		return fmt.Errorf("read the endpoints: %w", describe(err))
	}
	now := time.Now()
	open := make(map[string]gate, len(read))
	for _, x := range read {
		left := seconds(&x.left)
		if x.state == "half_open" {
			left = min(left, b.cfg.CoolDown)
		}
		open[x.endpoint] = gate{state: x.state, until: now.Add(left), hold: deref(x.hold), disabled: x.disabled}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	changed := len(open) != len(b.open)
	for e, g := range open {
		if old, ok := b.open[e]; !ok || old.state != g.state || old.disabled != g.disabled {
			changed = true
		}
	}
	b.open = open
	for e := range b.slow {
		if _, ok := open[e]; !ok {
			delete(b.slow, e)
		}
	}
	if changed {
		b.notify()
		b.logger.Debug("endpoints read", zap.Strings("not_closed", sortedKeys(open)))
	}
	return nil
}

// Flush writes the outcomes counted since the last write, in one
// statement, the endpoints in order. Outcomes it could not write are kept
// for the next.
func (b *Breaker) Flush(ctx context.Context) error {
	b.mu.Lock()
	counts := b.counts
	b.counts = map[string]*tally{}
	b.mu.Unlock()
	if len(counts) == 0 {
		return nil
	}
	keys := sortedKeys(counts)
	attempts, failures, reasons := make([]int32, len(keys)), make([]int32, len(keys)), make([]*string, len(keys))
	for i, k := range keys {
		t := counts[k]
		attempts[i], failures[i] = t.attempts, t.failures
		if t.reason != "" {
			r := excerpt(t.reason)
			reasons[i] = &r
		}
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StatementTimeout)
	defer cancel()
	rows, _ := b.cfg.DB.Query(ctx, b.sql.flush, keys, attempts, failures, reasons, b.cfg.Window.Seconds(),
		b.cfg.MinAttempts, b.cfg.FailureRatio, b.cfg.CoolDown.Seconds(), b.eventKind(), b.eventQueue(), b.eventPayload(), b.cfg.MaxCoolDown.Seconds())
	opened, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.mu.Lock()
		for k, t := range counts {
			if now := b.counts[k]; now != nil {
				t.attempts += now.attempts
				t.failures += now.failures
				t.reason = orElse(now.reason, t.reason)
			}
			b.counts[k] = t
		}
		b.mu.Unlock()
		return fmt.Errorf("record the endpoints' outcomes: %w", describe(err))
	}
	if len(opened) == 0 {
		return nil
	}
	// Read, the endpoints that opened say the instant their jobs wait for;
	// else they wait a cool-down from now, and a read follows. (Their
	// events are logged when a worker reads the events: Report.)
	if err := b.Load(ctx); err != nil {
		b.logger.Warn("reading the endpoints that opened failed; their jobs wait a cool-down from now", zap.Error(err))
		for _, e := range opened {
			b.set(e, "open", b.cfg.CoolDown, nil)
		}
	}
	return nil
}

// orElse is a unless it is empty, else b.
func orElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Run reports the events no worker has reported; then it reads the
// endpoints that are not closed, and reports the events, when woken and,
// while it knows of one open or half-open, every RefreshInterval; and it
// writes the outcomes counted every FlushInterval; until ctx is done: then
// it writes the last ones and returns nil. Call Load first: Run does not
// read the endpoints at once.
func (b *Breaker) Run(ctx context.Context) error {
	if err := b.Report(ctx); err != nil && ctx.Err() == nil { // the events of while no worker ran
		b.logger.Warn("reading the endpoints' events failed; a later read reports them", zap.Error(err))
	}
	flush := time.NewTicker(b.cfg.FlushInterval)
	defer flush.Stop()
	refresh := time.NewTicker(b.cfg.RefreshInterval)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
			defer cancel()
			if err := b.Flush(final); err != nil {
				b.logger.Warn("the last outcomes of the endpoints were not written", zap.Error(err))
			}
			return nil
		case <-flush.C:
			if err := b.Flush(ctx); err != nil && ctx.Err() == nil {
				b.logger.Warn("writing the endpoints' outcomes failed; they are kept for the next write", zap.Error(err))
			}
		case <-b.wake:
			b.load(ctx)
		case <-refresh.C:
			// Only while some endpoint is open or half-open: every change
			// is notified, and an idle worker whose endpoints are all
			// closed or disabled (which only a notified change ends)
			// sends nothing.
			if b.watching() {
				b.load(ctx)
			}
		}
	}
}

// watching reports whether an endpoint this worker knows is open or
// half-open.
func (b *Breaker) watching() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, g := range b.open {
		if !g.disabled {
			return true
		}
	}
	return false
}

func (b *Breaker) load(ctx context.Context) {
	if err := b.Load(ctx); err != nil && ctx.Err() == nil {
		b.logger.Warn("reading the endpoints failed; the last read holds", zap.Error(err))
	}
	if err := b.Report(ctx); err != nil && ctx.Err() == nil {
		b.logger.Warn("reading the endpoints' events failed; a later read reports them", zap.Error(err))
	}
}

// reportBatch bounds the events one statement of Report takes.
const reportBatch = 100

// Event is a row of endpoint_events.
type Event struct {
	ID       int64
	Endpoint string
	// Event is opened, closed, disabled or enabled.
	Event string
	At    time.Time
	// By is breaker or operator; Role is the database role of the
	// session that wrote it.
	By, Role string
	// Reason is the last failure before it, redacted as last_error is;
	// Note is the operator's.
	Reason, Note string
	// JobID is the job that tells of it, or 0.
	JobID int64
}

// Report takes the events that no worker has reported yet, and logs and
// counts each one: at Warn for opened and disabled, at Info for closed
// and enabled. Each event is reported by one worker only. The breaker's
// Run calls it with each read of the endpoints.
func (b *Breaker) Report(ctx context.Context) error {
	for {
		qctx, cancel := context.WithTimeout(ctx, b.cfg.StatementTimeout)
		rows, _ := b.cfg.DB.Query(qctx, b.sql.report, reportBatch)
		events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
			var e Event
			var job *int64
			err := r.Scan(&e.ID, &e.Endpoint, &e.Event, &e.At, &e.By, &e.Role, &e.Reason, &e.Note, &job)
			if job != nil {
				e.JobID = *job
			}
			return e, err
		})
		cancel()
		if err != nil {
			return fmt.Errorf("report the endpoints' events: %w", describe(err))
		}
		slices.SortFunc(events, func(a, b Event) int { return cmp.Compare(a.ID, b.ID) })
		for _, e := range events {
			b.logEvent(e)
		}
		if len(events) < reportBatch {
			return nil
		}
	}
}

// eventMessages are the log lines of the events.
var eventMessages = map[string]string{
	"opened":   "endpoint open: too many of its requests failed; its jobs wait",
	"closed":   "endpoint closed: its probe succeeded; its jobs go",
	"disabled": "endpoint disabled: its jobs fail until an operator enables it",
	"enabled":  "endpoint enabled: its circuit is closed; its jobs go",
}

func (b *Breaker) logEvent(e Event) {
	b.events.WithLabelValues(e.Event, e.By).Inc()
	fields := []zap.Field{
		zap.String("endpoint", e.Endpoint), zap.String("event", e.Event), zap.String("by", e.By), zap.String("role", e.Role),
		zap.Time("at", e.At), zap.Int64("event_id", e.ID),
	}
	if e.Reason != "" {
		fields = append(fields, zap.String("reason", e.Reason))
	}
	if e.Note != "" {
		fields = append(fields, zap.String("note", e.Note))
	}
	if e.JobID != 0 {
		fields = append(fields, zap.Int64("job_id", e.JobID))
	}
	msg := cmp.Or(eventMessages[e.Event], "endpoint event")
	if e.Event == "opened" || e.Event == "disabled" {
		b.logger.Warn(msg, fields...)
	} else {
		b.logger.Info(msg, fields...)
	}
}

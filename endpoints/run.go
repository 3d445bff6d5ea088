package endpoints

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// statements are the breaker's SQL, for one schema.
type statements struct {
	probe, close, reopen, load, flush string
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
	return statements{
		// probe takes the probe of $1 for $2 seconds, when its cool-down
		// or the last probe's time is over, and says the state it found,
		// for how long it holds, and the instant the others wait for
		// (holdSQL, the cool-down $3 seconds).
		probe: `WITH p AS (
    UPDATE ` + t + ` SET state = 'half_open', probe_until = now() + make_interval(secs => $2), updated_at = now()
    WHERE endpoint = $1 AND ((state = 'open' AND open_until <= now()) OR (state = 'half_open' AND probe_until <= now()))
    RETURNING endpoint, ` + fmt.Sprintf(holdSQL, "", "$3") + ` AS hold)
SELECT EXISTS (SELECT FROM p), e.state,
       extract(epoch FROM CASE e.state WHEN 'open' THEN e.open_until WHEN 'half_open' THEN e.probe_until END - now())::float8,
       coalesce((SELECT hold FROM p), CASE WHEN e.state <> 'closed' THEN ` + fmt.Sprintf(holdSQL, "e.", "$3") + ` END)
FROM ` + t + ` e WHERE e.endpoint = $1`,
		close: `WITH u AS (
    UPDATE ` + t + ` SET state = 'closed', attempts = 0, failures = 0, window_started_at = now(), opened_at = NULL,
        open_until = NULL, cool_down = NULL, probe_until = NULL, updated_at = now()
    WHERE endpoint = $1 AND state = 'half_open'
    RETURNING endpoint)
SELECT NULL::float8, NULL::timestamptz` + fmt.Sprintf(notifyFrom, 2),
		// reopen doubles the cool-down ($3 seconds when none), up to $4,
		// and opens the endpoint for it, and at least until the jobs held
		// by the probe are due (holdSQL), so that they are held again with
		// the jobs held since, until the same instant.
		reopen: `WITH u AS (
    UPDATE ` + t + ` SET state = 'open',
        cool_down = least(coalesce(cool_down, make_interval(secs => $3)) * 2, make_interval(secs => $4)),
        open_until = greatest(now() + least(coalesce(cool_down, make_interval(secs => $3)) * 2, make_interval(secs => $4)),
            least(probe_until, open_until + make_interval(secs => $3)) + interval '1 second'),
        probe_until = NULL, reason = $2, updated_at = now()
    WHERE endpoint = $1 AND state = 'half_open'
    RETURNING endpoint, extract(epoch FROM open_until - now())::float8 AS left_secs, open_until)
SELECT u.left_secs, u.open_until` + fmt.Sprintf(notifyFrom, 5),
		load: `SELECT endpoint, state,
       greatest(extract(epoch FROM CASE state WHEN 'open' THEN open_until ELSE probe_until END - now()), 0)::float8,
       ` + fmt.Sprintf(holdSQL, "", "$1") + `
FROM ` + t + ` WHERE state <> 'closed' ORDER BY endpoint`,
		flush: `SELECT e FROM ` + pgx.Identifier{schema, "record_endpoint_outcomes"}.Sanitize() + `($1, $2, $3, $4,
    make_interval(secs => $5), $6, $7, make_interval(secs => $8)) AS e`,
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
		hold            *time.Time
	}
	rows, _ := b.cfg.DB.Query(ctx, b.sql.load, b.cfg.CoolDown.Seconds())
	read, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.endpoint, &x.state, &x.left, &x.hold)
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
		open[x.endpoint] = gate{state: x.state, until: now.Add(left), hold: deref(x.hold)}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	changed := len(open) != len(b.open)
	for e, g := range open {
		if old, ok := b.open[e]; !ok || old.state != g.state {
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
		b.cfg.MinAttempts, b.cfg.FailureRatio, b.cfg.CoolDown.Seconds())
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
	for _, e := range opened {
		b.logger.Warn("endpoint open: too many of its requests failed; its jobs wait", zap.String("endpoint", e),
			zap.Duration("cool_down", b.cfg.CoolDown), zap.String("reason", excerpt(counts[e].reason)))
	}
	if len(opened) == 0 {
		return nil
	}
	// Read, the endpoints that opened say the instant their jobs wait for;
	// else they wait a cool-down from now, and a read follows.
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

// Run reads the endpoints that are not closed when woken and, while it
// knows of one, every RefreshInterval, and writes the outcomes counted every FlushInterval,
// until ctx is done; then it writes the last ones and returns nil. Call
// Load first: Run does not read them at once.
func (b *Breaker) Run(ctx context.Context) error {
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
			// Only while some endpoint is not closed: every change is
			// notified, and an idle worker whose endpoints are all closed
			// sends nothing.
			b.mu.Lock()
			watching := len(b.open) > 0
			b.mu.Unlock()
			if watching {
				b.load(ctx)
			}
		}
	}
}

func (b *Breaker) load(ctx context.Context) {
	if err := b.Load(ctx); err != nil && ctx.Err() == nil {
		b.logger.Warn("reading the endpoints failed; the last read holds", zap.Error(err))
	}
}

package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// DeadFilter selects dead jobs to replay, as after a receiver's outage.
// Empty fields select everything.
type DeadFilter struct {
	Queue string
	Kind  string
	// Since and Until bound finished_at, when the job died: Since is
	// inclusive, Until exclusive. A zero time leaves that side open; a job
	// without a finished_at is selected only when both are zero.
	Since, Until time.Time
	// Host selects http_callback jobs whose payload url names this host:
	// a name or an IP (IPv6 with or without brackets), compared with the
	// url's host as their endpoints name them (endpoints.HostPort: without
	// regard to case or a trailing dot, an IP in any of its forms),
	// optionally with a port, which must then be the url's (its explicit
	// port, or 80 for http and 443 for https). The url is read as the
	// http_callback executor reads it (httpcallback.PayloadURL); a job
	// whose url it cannot read is not selected. Host implies Kind
	// http_callback.
	Host string
}

// Validate reports whether f is a filter Admin can apply, with an error that
// names the field.
func (f DeadFilter) Validate() error {
	_, err := f.check()
	return err
}

// check validates f and returns the match of its host, nil when it has none.
func (f DeadFilter) check() (*hostMatch, error) {
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return nil, fmt.Errorf("since (%s) must be before until (%s)", f.Since.Format(time.RFC3339Nano), f.Until.Format(time.RFC3339Nano))
	}
	if f.Host == "" {
		return nil, nil
	}
	if f.Kind != "" && f.Kind != httpcallback.Kind {
		return nil, fmt.Errorf("host selects %s jobs: it cannot go with kind %q", httpcallback.Kind, f.Kind)
	}
	m, err := parseHost(f.Host)
	if err != nil {
		// Not echoed: a host given as user:password@host holds a secret.
		return nil, fmt.Errorf("host: %w", err)
	}
	return m, nil
}

// hostMatch is a parsed DeadFilter.Host.
type hostMatch struct {
	host, port string // port is empty when any port matches
}

var errHostForm = errors.New("want a host name or IP, optionally with :port, not a URL")

func parseHost(h string) (*hostMatch, error) {
	if strings.ContainsAny(h, "/?#@ \t\r\n") {
		return nil, errHostForm
	}
	host, port, err := net.SplitHostPort(h)
	switch {
	case err == nil:
		if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 || port[0] == '0' {
			return nil, fmt.Errorf("port %q: want a number from 1 to 65535", port)
		}
	case strings.Count(h, ":") > 1 && !strings.HasPrefix(h, "["): // an IPv6 address without a port
		host = h
	case strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]"):
		host = h[1 : len(h)-1]
	case strings.Contains(h, ":") || strings.ContainsAny(h, "[]"):
		return nil, errHostForm
	default:
		host = h
	}
	if host == "" || strings.ContainsAny(host, "[]") {
		return nil, errHostForm
	}
	return &hostMatch{host: endpoints.Host(host), port: port}, nil
}

// match reports whether the object of a payload's url fields names m's host.
func (m *hostMatch) match(urlFields []byte) bool {
	if urlFields == nil {
		return false
	}
	u, err := httpcallback.PayloadURL(urlFields)
	if err != nil {
		return false
	}
	host, port := endpoints.HostPort(u)
	return host == m.host && (m.port == "" || port == m.port)
}

// deadWhere is the condition that selects f's dead jobs, its arguments
// numbered from $next on.
func deadWhere(f DeadFilter, next int) (string, []any) {
	var args []any
	where := "status = 'dead'"
	cond := func(sql string, v any) {
		where += fmt.Sprintf(" AND "+sql, next+len(args))
		args = append(args, v)
	}
	kind := f.Kind
	if f.Host != "" {
		kind = httpcallback.Kind
	}
	if f.Queue != "" {
		cond("queue = $%d", f.Queue)
	}
	if kind != "" {
		cond("kind = $%d", kind)
	}
	if !f.Since.IsZero() {
		cond("finished_at >= $%d", f.Since)
	}
	if !f.Until.IsZero() {
		cond("finished_at < $%d", f.Until)
	}
	return where, args
}

// urlFields are a payload's url as encoding/json finds it: every key that
// matches "url" without regard to case (no other letter folds to u, r or l),
// in the payload's order. Only these reach the client, whatever the
// payload's size.
const urlFields = `CASE WHEN jsonb_typeof(payload) = 'object' THEN
    (SELECT jsonb_object_agg(k, v ORDER BY n) FROM jsonb_each(payload) WITH ORDINALITY e(k, v, n) WHERE lower(k) = 'url')
END`

// deadPage reads the jobs f selects with an id above after (from the first
// when nil), in id order, at most limit of them, on q; with lock it locks
// them, skipping locked rows. It returns the ids that match f's host, how
// many rows it read and the last id it read.
func (a *Admin) deadPage(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, f DeadFilter, m *hostMatch, after *int64, limit int, lock bool,
) (ids []int64, read int, last int64, err error) {
	where, args := deadWhere(f, 3)
	fields := "NULL::jsonb"
	if m != nil {
		fields = urlFields
	}
	// The first page has a statement of its own, so that a plan for the
	// others can start its scan at after.
	next := `id > $1`
	if after == nil {
		next = `$1::bigint IS NULL`
	}
	stmt := `SELECT id, ` + fields + ` FROM {jobs} WHERE ` + where + ` AND ` + next + ` ORDER BY id LIMIT $2`
	if lock {
		stmt += ` FOR UPDATE SKIP LOCKED`
	}
	rows, err := q.Query(ctx, a.sql(stmt), append([]any{after, limit}, args...)...)
	if err != nil {
		return nil, 0, 0, err
	}
	var (
		id     int64
		fieldv []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &fieldv}, func() error {
		read++
		last = id
		if m == nil || m.match(fieldv) {
			ids = append(ids, id)
		}
		return nil
	})
	return ids, read, last, err
}

// DeadCount is what CountDead found.
type DeadCount struct {
	Count int64 `json:"count"`
	// FirstIDs are the lowest ids among them, as many as asked for.
	FirstIDs []int64 `json:"first_ids"`
}

// countPage is how many rows one statement of a count by host reads.
const countPage = 5 * BatchSize

// CountDead counts the dead jobs f selects, and returns the lowest first of
// their ids, changing nothing: what RetryDeadMatching would retry now.
// Without a host two statements in one snapshot count them; with one, the
// jobs of the window are read in pages, each under the Admin's timeout.
func (a *Admin) CountDead(ctx context.Context, f DeadFilter, first int) (DeadCount, error) {
	m, err := f.check()
	if err != nil {
		return DeadCount{}, err
	}
	first = max(first, 0)
	if m == nil {
		return a.countDeadSQL(ctx, f, first)
	}
	var (
		out   DeadCount
		after *int64
	)
	for {
		ids, read, last, err := a.countPage(ctx, f, m, after)
		if err != nil {
			return DeadCount{}, fmt.Errorf("count dead jobs: %w", err)
		}
		out.Count += int64(len(ids))
		out.FirstIDs = append(out.FirstIDs, ids[:min(len(ids), first-len(out.FirstIDs))]...)
		if read < countPage {
			return out, nil
		}
		after = &last
	}
}

func (a *Admin) countPage(ctx context.Context, f DeadFilter, m *hostMatch, after *int64) ([]int64, int, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	return a.deadPage(ctx, a.pool, f, m, after, countPage, false)
}

func (a *Admin) countDeadSQL(ctx context.Context, f DeadFilter, first int) (DeadCount, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	tx, err := a.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return DeadCount{}, fmt.Errorf("count dead jobs: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var out DeadCount
	where, args := deadWhere(f, 1)
	if err := tx.QueryRow(ctx, a.sql(`SELECT count(*) FROM {jobs} WHERE `+where), args...).Scan(&out.Count); err != nil {
		return DeadCount{}, fmt.Errorf("count dead jobs: %w", err)
	}
	where, args = deadWhere(f, 2)
	rows, _ := tx.Query(ctx, a.sql(`SELECT id FROM {jobs} WHERE `+where+` ORDER BY id LIMIT $1`), append([]any{first}, args...)...)
	if out.FirstIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		return DeadCount{}, fmt.Errorf("count dead jobs: %w", err)
	}
	return out, nil
}

// RetryDeadMatching retries the dead jobs f selects, BatchSize at a time:
// each batch in a transaction of its own, its rows locked in id order, rows
// that a worker, the sweeper or another admin holds skipped. Every job gets
// at least one more attempt, as Retry gives. It returns how many it retried,
// also when it stops at an error.
func (a *Admin) RetryDeadMatching(ctx context.Context, f DeadFilter) (int64, error) {
	m, err := f.check()
	if err != nil {
		return 0, err
	}
	var (
		total int64
		after *int64 // the last id of the batch before; nil at first (ids may be negative)
	)
	for {
		n, read, last, err := a.retryDeadBatch(ctx, f, m, after)
		total += n
		if err != nil {
			return total, fmt.Errorf("retry dead jobs: %w", err)
		}
		if read < BatchSize {
			return total, nil
		}
		after = &last
	}
}

func (a *Admin) retryDeadBatch(ctx context.Context, f DeadFilter, m *hostMatch, after *int64) (n int64, read int, last int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	ids, read, last, err := a.deadPage(ctx, tx, f, m, after, BatchSize, true)
	if err != nil {
		return 0, 0, 0, err
	}
	if len(ids) > 0 {
		// The rows are this transaction's: locked above, in id order.
		tag, err := tx.Exec(ctx, a.sql(`UPDATE {jobs} j SET `+retrySet+`
		    FROM unnest($1::bigint[]) l(id) WHERE j.id = l.id AND j.status = 'dead'`), ids)
		if err != nil {
			return 0, 0, 0, err
		}
		n = tag.RowsAffected()
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, 0, err
	}
	return n, read, last, nil
}

// Now is the database's clock, which sets finished_at: the time to take a
// DeadFilter's "that long ago" from.
func (a *Admin) Now(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var now time.Time
	if err := a.pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("the database's clock: %w", err)
	}
	return now, nil
}

// Package sweeper gives back the jobs of workers that died and purges
// finished jobs.
//
// Every worker runs a Sweeper; a transaction-scoped advisory lock, keyed by
// the schema, lets one of them work at a time. A pass runs in one
// transaction unless there is more to purge than one batch:
//   - a running job whose lease has expired goes back to pending, or to dead
//     when its attempts are used up; the lost attempt goes into the job's
//     errors. The UPDATE is guarded by
//     status = 'running' AND locked_until < now(), so a live worker whose
//     heartbeat renewed the lease keeps its job;
//   - done jobs older than RetainDone, and dead or cancelled jobs older than
//     RetainDead, are deleted in batches;
//   - the flow_keys rows no longer needed are deleted in batches, in
//     (queue, key) order (flowKeysSQL);
//   - the endpoints not written for EndpointIdle, closed or with their
//     cool-down or probe's time ended that long ago, enabled and without
//     a note, are deleted in batches, in endpoint order (endpointsSQL);
//   - the endpoints' events older than RetainDead are deleted in batches,
//     in id order (eventsSQL).
//
// At each pass, every worker's sweeper, with the lock or without, looks at
// what holds back the database's xmin horizon (horizon.go), in the pass's
// first transaction, and warns when it is older than OldestXminWarn.
package sweeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/retry"
	"github.com/pgdispatch/pgdispatch/internal/stmttimeout"
)

// The defaults of Config.
const (
	DefaultInterval   = 30 * time.Second
	DefaultRetainDone = 24 * time.Hour
	DefaultRetainDead = 7 * 24 * time.Hour
)

const (
	defaultMaxAttempts = 5
	defaultBatchSize   = 1000 // the rows one statement changes
	maxBatchesPerPass  = 100
)

// Config configures a Sweeper.
type Config struct {
	// Pool runs every statement. Required.
	Pool *pgxpool.Pool
	// Schema is the pgdispatch schema; it names the jobs table and scopes the
	// advisory lock. Required.
	Schema string
	// Interval between passes. Default: 30s.
	Interval time.Duration
	// RetainDone is how long done jobs are kept; a negative one purges them
	// at the next pass whatever their age, for workers that delete jobs as
	// they finish (pgdispatch.RetainDoneNone). Default: 24h.
	RetainDone time.Duration
	// RetainDead is how long dead and cancelled jobs are kept. Default: 7 days.
	RetainDead time.Duration
	// MaxAttempts applies to rescued jobs whose max_attempts is NULL. Default: 5.
	MaxAttempts int
	// StatementTimeout bounds each pass's transaction. Default:
	// pgdispatch.DefaultStatementTimeout (10s).
	StatementTimeout time.Duration
	// OldestXminWarn is the age of the database's oldest snapshot (the
	// xmin horizon, see Sweeper.OldestXmin) past which the sweeper warns,
	// once each time it rises past it. Default: 5 minutes.
	OldestXminWarn time.Duration
	// Logger receives the sweeper's logs. Default: no logging.
	Logger *zap.Logger
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("sweeper: Pool is required")
	case c.Schema == "":
		return errors.New("sweeper: Schema is required")
	case c.Interval < 0, c.RetainDead < 0, c.MaxAttempts < 0, c.StatementTimeout < 0, c.OldestXminWarn < 0:
		return errors.New("sweeper: durations and counts must not be negative")
	}
	return nil
}

// Result is what one pass did.
type Result struct {
	Locked  bool  // false when another sweeper held the lock and this pass did nothing
	Rescued int64 // expired leases given back to pending
	Killed  int64 // expired leases whose attempts were used up: now dead
	Purged  int64 // finished jobs deleted
	// FlowKeys counts the flow_keys rows deleted: keys that have no
	// pending or running job and no start within their rate window.
	FlowKeys int64
	// Endpoints counts the endpoints rows deleted: not written for
	// EndpointIdle, and closed, or open or half-open with their cool-down
	// or probe's time ended EndpointIdle ago.
	Endpoints int64
	// Events counts the endpoint_events rows deleted: older than
	// RetainDead.
	Events int64
}

// EndpointIdle is how long an endpoint stays in the endpoints table
// closed and not written (no request sent to it) before a pass deletes
// it: a writer's URLs can name any number of hosts, and the breaker's
// counts of one unused that long are of no use. An open endpoint is
// deleted once its cool-down ended EndpointIdle ago, and a half-open one
// once its probe's time did: no job asked for it since (one that asks
// takes the probe, which writes the row), and its next job goes as to a
// closed one.
const EndpointIdle = 24 * time.Hour

// Sweeper rescues expired leases and purges old jobs. Create it with New.
type Sweeper struct {
	cfg    Config
	logger *zap.Logger
	rescue string
	// flowEnded calls flow_ended (migration 017) with the queues of the
	// jobs a pass killed.
	flowEnded string
	purge     string
	flow      string
	endpoints string
	events    string
	// poolSize is the pool's MaxConns, read once (Pool.Config copies the
	// whole config): how many dead connections a pass may meet in a row.
	poolSize int
	// batchSize bounds the rows one statement changes: defaultBatchSize
	// but in the tests.
	batchSize int

	rescued, killed, purged atomic.Int64
	horizon                 horizon
}

// Stats is what every pass so far did, in total.
func (s *Sweeper) Stats() Result {
	return Result{Rescued: s.rescued.Load(), Killed: s.killed.Load(), Purged: s.purged.Load()}
}

// New checks cfg, fills defaults and returns a Sweeper.
func New(cfg Config) (*Sweeper, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.RetainDone = max(cmp.Or(cfg.RetainDone, DefaultRetainDone), 0)
	cfg.RetainDead = cmp.Or(cfg.RetainDead, DefaultRetainDead)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, defaultMaxAttempts)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, stmttimeout.Default)
	cfg.OldestXminWarn = cmp.Or(cfg.OldestXminWarn, DefaultOldestXminWarn)
	jobs := pgx.Identifier{cfg.Schema, "jobs"}.Sanitize()
	return &Sweeper{
		cfg:       cfg,
		logger:    cmp.Or(cfg.Logger, zap.NewNop()).Named("sweeper"),
		rescue:    strings.NewReplacer("{jobs}", jobs, "{lost}", lostSQL).Replace(rescueSQL),
		flowEnded: "SELECT " + pgx.Identifier{cfg.Schema, "flow_ended"}.Sanitize() + "($1)",
		purge:     strings.ReplaceAll(purgeSQL, "{jobs}", jobs),
		flow: strings.NewReplacer("{jobs}", jobs,
			"{flow_keys}", pgx.Identifier{cfg.Schema, "flow_keys"}.Sanitize(),
			"{flow_limits}", pgx.Identifier{cfg.Schema, "flow_limits"}.Sanitize()).Replace(flowKeysSQL),
		endpoints: strings.ReplaceAll(endpointsSQL, "{endpoints}", pgx.Identifier{cfg.Schema, "endpoints"}.Sanitize()),
		events:    strings.ReplaceAll(eventsSQL, "{events}", pgx.Identifier{cfg.Schema, "endpoint_events"}.Sanitize()),

		poolSize:  int(cfg.Pool.Config().MaxConns),
		batchSize: defaultBatchSize,
	}, nil
}

// lockSQL takes the sweep's lock, and keeps this transaction's statements to
// their indexes: a plan the connection kept from when the table was nearly
// empty would otherwise scan the whole table at every sweep (see PlanSQL in
// claimer/internal/pinned).
const lockSQL = `SELECT pg_try_advisory_xact_lock(hashtext('pgdispatch.sweeper'), hashtext($1)),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true)`

// rescueSQL gives back a batch of expired leases. The lost attempt goes into
// the job's errors as a failed one does (after the last 19 before it, so
// that errors holds the last 20, as the claimer's completions do): its
// start is the claim's mark, the updated_at the claim wrote, which nothing
// else changes while the job runs. {lost} is what happened (lostSQL).
const rescueSQL = `
WITH s AS (
    SELECT id FROM {jobs}
    WHERE status = 'running' AND locked_until < now()
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE {jobs} j
SET status = CASE WHEN j.attempts >= coalesce(j.max_attempts, $1) THEN 'dead' ELSE 'pending' END,
    run_at = now(),
    last_error = {lost},
    errors = jsonb_path_query_array(coalesce(j.errors, '[]'), '$[last - 18 to last]')
             || jsonb_build_object('attempt', j.attempts, 'started_at', j.updated_at, 'finished_at', now(),
                                   'worker', j.locked_by, 'error', {lost}),
    finished_at = CASE WHEN j.attempts >= coalesce(j.max_attempts, $1) THEN now() END,
    locked_by = NULL,
    locked_until = NULL,
    updated_at = now()
WHERE j.id = ANY(ARRAY(SELECT id FROM s)) AND j.status = 'running' AND j.locked_until < now()
RETURNING j.id, j.status, j.attempts, j.queue`

// lostSQL says what happened to an attempt whose lease expired.
const lostSQL = `format('lease expired: worker %s stopped renewing it during attempt %s of %s',
                   j.locked_by, j.attempts, coalesce(j.max_attempts, $1))`

const purgeSQL = `
WITH d AS (
    SELECT id FROM {jobs}
    WHERE status = ANY($1::text[]) AND finished_at <= now() - make_interval(secs => $2::float8)
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {jobs} j WHERE j.id = ANY(ARRAY(SELECT id FROM d))`

// flowKeysSQL deletes a batch of the flow_keys rows no longer needed, in
// (queue, key) order, the rows a claim holds skipped: a key with no
// pending or running job whose newest start is older than the largest per
// of its queue's limits, or that has no start (or whose queue has no rate).
// A key whose row is deleted while a job of it commits gets a new row at
// its next claim: its head and starts, which no job needs any more, are
// not missed.
const flowKeysSQL = `
WITH d AS (
    SELECT k.queue, k.key FROM {flow_keys} k
    WHERE coalesce(k.starts[pg_catalog.array_upper(k.starts, 1)]
                   < now() - (SELECT max(l.per) FROM {flow_limits} l WHERE l.queue = k.queue), true)
      AND NOT EXISTS (SELECT FROM {jobs} j WHERE j.queue = k.queue AND j.flow_key = k.key AND j.status = 'pending')
      AND NOT EXISTS (SELECT FROM {jobs} j WHERE j.queue = k.queue AND j.flow_key = k.key AND j.status = 'running')
    ORDER BY k.queue, k.key
    LIMIT $1
    FOR UPDATE OF k SKIP LOCKED
)
DELETE FROM {flow_keys} k USING d WHERE k.queue = d.queue AND k.key = d.key`

// endpointsSQL deletes a batch of the endpoints not written for $2
// seconds that are closed, or open or half-open with their cool-down or
// probe's time ended $2 seconds ago, in endpoint order, the rows a
// worker's flush holds skipped. A disabled endpoint, or one with a note,
// is the operator's: it stays.
const endpointsSQL = `
WITH d AS (
    SELECT e.endpoint FROM {endpoints} e
    WHERE e.updated_at < now() - make_interval(secs => $2)
      AND (e.state = 'closed'
           OR (e.state = 'open' AND e.open_until < now() - make_interval(secs => $2))
           OR (e.state = 'half_open' AND e.probe_until < now() - make_interval(secs => $2)))
      AND e.disabled_at IS NULL AND e.note IS NULL
    ORDER BY e.endpoint
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {endpoints} e USING d WHERE e.endpoint = d.endpoint`

// eventsSQL deletes a batch of the endpoints' events older than $2
// seconds, in id order.
const eventsSQL = `
WITH d AS (
    SELECT id FROM {events}
    WHERE at < now() - make_interval(secs => $2)
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {events} x WHERE x.id = ANY(ARRAY(SELECT id FROM d))`

// Run sweeps every Interval until ctx ends, starting at once, each pass
// looking at the xmin horizon too. It returns nil when ctx is cancelled.
//
// A pass that meets a dead connection is run again at once, up to the
// pool's size in a row (retry.Backoff): after a restart or a mass
// termination every idle connection of the pool is dead, and waiting an
// Interval for each would leave crashed workers' jobs unrescued for minutes.
// Any other failure waits for the next Interval.
func (s *Sweeper) Run(ctx context.Context) error {
	s.logger.Info("sweeper started", zap.Duration("interval", s.cfg.Interval))
	t := time.NewTimer(0)
	defer t.Stop()
	backoff := retry.New(s.poolSize)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		next := s.cfg.Interval
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			again := backoff.Next(err) == 0
			s.logger.Warn("sweep failed", zap.Error(err), zap.Int("failures", backoff.Failures()), zap.Bool("retry_now", again))
			if again {
				next = 0
			}
		} else {
			backoff = retry.New(s.poolSize)
		}
		t.Reset(next)
	}
}

// Sweep runs one pass now. Its first transaction also looks at the xmin
// horizon, so that the look costs an idle database no transaction of its
// own.
func (s *Sweeper) Sweep(ctx context.Context) (Result, error) {
	var total Result
	for i := range maxBatchesPerPass {
		res, more, err := s.sweepOnce(ctx, i == 0)
		total.Locked = total.Locked || res.Locked
		total.Rescued += res.Rescued
		total.Killed += res.Killed
		total.Purged += res.Purged
		total.FlowKeys += res.FlowKeys
		total.Endpoints += res.Endpoints
		total.Events += res.Events
		s.rescued.Add(res.Rescued)
		s.killed.Add(res.Killed)
		s.purged.Add(res.Purged)
		if err != nil || !more {
			return total, err
		}
	}
	return total, nil
}

// sweepOnce runs one transaction: one batch of each kind of work, and,
// when look is set, first a look at the xmin horizon (horizon.go). more
// reports that a batch was full.
func (s *Sweeper) sweepOnce(ctx context.Context, look bool) (res Result, more bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	tx, err := s.cfg.Pool.Begin(ctx)
	if err != nil {
		return res, false, fmt.Errorf("sweep: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit this is a no-op

	if look {
		if err := s.noteHorizon(tx.QueryRow(ctx, horizonSQL)); err != nil {
			return res, false, fmt.Errorf("sweep: look at the xmin horizon: %w", err)
		}
	}

	if err := tx.QueryRow(ctx, lockSQL, s.cfg.Schema).Scan(&res.Locked, nil, nil, nil); err != nil {
		return res, false, fmt.Errorf("sweep: take lock: %w", err)
	}
	if !res.Locked {
		s.logger.Debug("another sweeper is working")
		return res, false, nil
	}

	rows, err := tx.Query(ctx, s.rescue, s.cfg.MaxAttempts, s.batchSize)
	if err != nil {
		return res, false, fmt.Errorf("sweep: rescue expired leases: %w", err)
	}
	var (
		n      int
		killed []string // the queues of the jobs killed
	)
	for rows.Next() {
		var (
			id            int64
			status, queue string
			attempts      int32
		)
		if err := rows.Scan(&id, &status, &attempts, &queue); err != nil {
			rows.Close()
			return res, false, fmt.Errorf("sweep: rescue expired leases: %w", err)
		}
		n++
		if status == "dead" {
			res.Killed++
			if !slices.Contains(killed, queue) {
				killed = append(killed, queue)
			}
			s.logger.Warn("lease expired and attempts used up: job dead", zap.Int64("job_id", id), zap.Int32("attempt", attempts))
		} else {
			res.Rescued++
			s.logger.Warn("lease expired: job back to pending", zap.Int64("job_id", id), zap.Int32("attempt", attempts))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, false, fmt.Errorf("sweep: rescue expired leases: %w", err)
	}
	more = n == s.batchSize
	// A job rescued to pending wakes its queue's sleeping workers (the
	// trigger of migration 009); one killed may let the next job of its
	// flow key start (flow_ended, migration 017).
	if len(killed) > 0 {
		if _, err := tx.Exec(ctx, s.flowEnded, killed); err != nil {
			return res, false, fmt.Errorf("sweep: tell the queues of the jobs killed: %w", err)
		}
	}

	for _, p := range []struct {
		statuses []string
		retain   time.Duration
	}{
		{[]string{"done"}, s.cfg.RetainDone},
		{[]string{"dead", "cancelled"}, s.cfg.RetainDead},
	} {
		tag, err := tx.Exec(ctx, s.purge, p.statuses, p.retain.Seconds(), s.batchSize)
		if err != nil {
			return res, false, fmt.Errorf("sweep: purge %s jobs: %w", strings.Join(p.statuses, "/"), err)
		}
		res.Purged += tag.RowsAffected()
		more = more || tag.RowsAffected() == int64(s.batchSize)
	}
	tag, err := tx.Exec(ctx, s.flow, s.batchSize)
	if err != nil {
		return res, false, fmt.Errorf("sweep: delete flow keys: %w", err)
	}
	res.FlowKeys = tag.RowsAffected()
	more = more || res.FlowKeys == int64(s.batchSize)
	tag, err = tx.Exec(ctx, s.endpoints, s.batchSize, EndpointIdle.Seconds())
	if err != nil {
		return res, false, fmt.Errorf("sweep: delete idle endpoints: %w", err)
	}
	res.Endpoints = tag.RowsAffected()
	more = more || res.Endpoints == int64(s.batchSize)
	tag, err = tx.Exec(ctx, s.events, s.batchSize, s.cfg.RetainDead.Seconds())
	if err != nil {
		return res, false, fmt.Errorf("sweep: delete old endpoint events: %w", err)
	}
	res.Events = tag.RowsAffected()
	more = more || res.Events == int64(s.batchSize)
	if err := tx.Commit(ctx); err != nil {
		return res, false, fmt.Errorf("sweep: commit: %w", err)
	}
	if res.Purged > 0 {
		s.logger.Debug("purged finished jobs", zap.Int64("num_purged", res.Purged))
	}
	return res, more, nil
}

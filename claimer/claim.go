package claimer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/cursor"
	"github.com/pgdispatch/pgdispatch/claimer/internal/giveback"
	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runners"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
)

// claimSQL claims up to $2 due jobs of queue $1 for worker $3, under a lease
// of $4 seconds ($5: the attempts of a job whose max_attempts is NULL), in
// (priority, run_at, id) order from the front of the queue (from the
// cursor: internal/cursor), until their payloads' size passes $6 bytes
// (one job at least; a compressed payload is measured decompressed).
// attempts stops at 1,000,000, the constraint's bound, so that no row the
// table accepts makes the claim fail. Its updated_at, now(), marks the claim:
// the outcome is written only while the row still carries it.
//
// It walks the queue priority by priority (pr: the first pending job of
// each priority, read only as far as the claim needs), and takes each
// priority's due jobs by the priority's equality, from that first job to
// the first not due: a scan in (priority, run_at, id) order without the
// equality could not end there, and read every job scheduled for later at
// each claim that came up short.
//
// It claims nothing while the queue is paused (a row in the queues table
// with paused_at set), or limited (limited set: the queue has flow limits,
// and claim_flow claims it, migrations/sql/017_claim_flow.sql), and says
// which. Its last two columns are claim_flow's own, so that one reader
// reads both.
//
// It returns the time of the claim, now(), the seconds the server took
// (read once every CTE has run, so that the claim is timed on the server,
// not across the network), and when it claims nothing, the seconds until
// the earliest future run_at, on the database's clock, and whether it
// skipped due rows: any due row its snapshot sees was locked by another
// transaction. A claim that takes jobs but fewer than asked reports
// neither (NULL): the claimer looks again within a millisecond after it
// (internal/machine: lingering), and that look reports them. A lone job's
// claim, which takes it, is spared the two reads.
//
// The claim walks (pr, cursor.Walk) one by one through the first 16
// priorities that have pending jobs only (cursor.Walked), and takes the due
// jobs past them in one scan in (priority, run_at, id) order
// (cursor.PastWalked), so that a queue with jobs ahead at thousands of
// priorities costs a claim 16 index descents and that scan, not two
// descents a priority; and so that due jobs another transaction holds
// locked at thousands of priorities cost it an index entry and a heap page
// each, not the two descents of a walk's step to each (the look from the
// front, cursor.LookSQL, which takes no lock, walks on past the 16th to
// each next priority with a due job).
//
// It commits without waiting for its WAL flush (pinned.ClaimPlanSQL): a claim lost
// in a server crash leaves its jobs pending, and they run again. The UPDATE
// finds its rows by the ctids c locked rather than by joining c, whose
// generic plan, blind to LIMIT $2, was a hash join over the whole table.
var claimSQL = claimStatement(false)

// leanClaimSQL is claimSQL for a claim that expects few jobs or none (a
// notification starts it, or the claim before it came up short:
// machine.Lean): it takes the due jobs of the queue's first priority only
// (the priority of its first pending job, due or not) in one scan, with
// no walk to the next priorities nor the scan past the 16th, and, when it
// takes nothing, reads the queue's first run_at in jobs_schedule_idx
// instead of next_in and stranded. The walk's plan nodes and theirs,
// started at every claim though most run no row, were 0.09 ms of a lone
// job's claim round trip (0.77 ms, 20 ms apart). A lean claim that takes
// nothing while that run_at is due (a due job it did not take: at a later
// priority, or locked) is followed at once by the full claim (claimOnce);
// one that takes fewer than asked, by the look 0.5 ms after it (machine:
// lingering). After two claims in a row that took jobs, the claim is full
// (machine.Lean).
var leanClaimSQL = claimStatement(true)

// claimStatement is claimSQL, or leanClaimSQL when lean.
func claimStatement(lean bool) string {
	if lean {
		return claimHead + leanScan + claimUpdate + leanTold + claimEnd
	}
	return claimHead + ", " + cursor.Walk(cursor.Unpaused) + claimScan + claimPastWalked + claimScanEnd + claimUpdate + claimTold + claimEnd
}

// The parts of claimStatement.
var (
	claimHead = `
WITH RECURSIVE p AS (
    SELECT coalesce(bool_or(paused_at IS NOT NULL), false) AS paused, coalesce(bool_or(limited), false) AS limited
    FROM {queues} WHERE name = $1
)`
	leanScan = `, c AS (
    SELECT ctid, priority, run_at, id,
           CASE WHEN pg_column_compression(payload) IS NULL THEN pg_column_size(payload)
                ELSE pg_column_size(payload || '{}'::jsonb) END AS size
    FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at <= now()
      AND priority = (SELECT priority FROM {jobs}
                      WHERE status = 'pending' AND queue = $1` + cursor.Unpaused + `
                      ORDER BY priority, run_at, id LIMIT 1)
    ORDER BY run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
`
	claimScan = `, c AS (
    SELECT d.ctid, d.priority, d.run_at, d.id, d.size
    FROM (
        SELECT w.* FROM ` + cursor.Walked + ` CROSS JOIN LATERAL (
            SELECT ctid, priority, run_at, id,
                   CASE WHEN pg_column_compression(payload) IS NULL THEN pg_column_size(payload)
                        ELSE pg_column_size(payload || '{}'::jsonb) END AS size
            FROM {jobs}
            WHERE status = 'pending' AND queue = $1 AND ` + cursor.OnePriority + `
            ORDER BY run_at, id
            LIMIT $2
            FOR UPDATE SKIP LOCKED) w
`
	claimPastWalked = `      UNION ALL
        SELECT r.* FROM (
            SELECT ctid, priority, run_at, id,
                   CASE WHEN pg_column_compression(payload) IS NULL THEN pg_column_size(payload)
                        ELSE pg_column_size(payload || '{}'::jsonb) END AS size
            FROM {jobs}
            WHERE status = 'pending' AND queue = $1 AND ` + cursor.PastWalked + ` AND run_at <= now()
            ORDER BY priority, run_at, id
            LIMIT $2
            FOR UPDATE SKIP LOCKED) r
`
	claimScanEnd = `    ) d
    LIMIT $2
`
	claimUpdate = `), u AS (
    UPDATE {jobs} j
    SET status = 'running',
        attempts = least(j.attempts, 999999) + 1,
        max_attempts = coalesce(j.max_attempts, $5),
        locked_by = $3,
        locked_until = now() + make_interval(secs => $4::float8),
        updated_at = now()
    WHERE j.ctid = ANY(ARRAY(
        SELECT ctid FROM (
            SELECT ctid, sum(size) OVER (ORDER BY priority, run_at, id) - size AS before FROM c
        ) s WHERE before < $6))
    RETURNING j.id, j.kind, j.payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.updated_at,
              j.traceparent, j.tracestate
), k AS (
    SELECT count(*) AS claimed FROM u
), n AS (
`
	claimTold = `    SELECT CASE WHEN k.claimed = 0 AND NOT p.paused AND NOT p.limited THEN
               (SELECT extract(epoch FROM min(run_at) - now())::float8 FROM {jobs}
                WHERE status = 'pending' AND queue = $1 AND run_at > now())
           END AS next_in,
           CASE WHEN k.claimed = 0 AND NOT p.paused AND NOT p.limited THEN
               EXISTS (SELECT FROM ` + cursor.Walked + ` CROSS JOIN LATERAL (
                           SELECT FROM {jobs}
                           WHERE status = 'pending' AND queue = $1 AND ` + cursor.OnePriority + `
                           ORDER BY run_at, id
                           LIMIT 1) d)
               OR EXISTS (SELECT FROM (
                              SELECT FROM {jobs}
                              WHERE status = 'pending' AND queue = $1 AND ` + cursor.PastWalked + ` AND run_at <= now()
                              ORDER BY priority, run_at, id
                              LIMIT 1) r)
           END AS stranded,
`
	leanTold = `    SELECT CASE WHEN k.claimed = 0 AND NOT p.paused AND NOT p.limited THEN
               (SELECT extract(epoch FROM min(run_at) - now())::float8 FROM {jobs}
                WHERE status = 'pending' AND queue = $1)
           END AS next_in, NULL::bool AS stranded,
`
	claimEnd = `           p.paused AND NOT p.limited AS paused, p.limited
    FROM k, p
)
SELECT u.id, u.kind, u.payload, u.priority, u.attempts, u.max_attempts, u.run_at, u.created_at,
       u.updated_at, n.next_in, n.stranded, n.paused, now(),
       extract(epoch FROM clock_timestamp() - statement_timestamp())::float8, u.traceparent, u.tracestate,
       n.limited, false, NULL::text, false
FROM n LEFT JOIN u ON true`
)

// flowSQL claims a queue with flow limits: claim_flow (migration 017)
// takes the claim's arguments, where its walk over the keys starts and
// whether it looks for jobs without a key, and returns the columns claimSQL
// does.
const flowSQL = `SELECT * FROM {claim_flow}($1, $2, $3, $4, $5, $6, $7, $8)`

// unkeyedEvery is how often the claims that follow freed slots ask
// claim_flow to look for jobs without a key while its last look found
// none: the look walks the front of the queue, which a drain fills with
// dead entries. Claims woken otherwise (a notification, a timer) look.
const unkeyedEvery = 100 * time.Millisecond

// flowState is what a claim tells beside its jobs about flow limits.
type flowState struct {
	limited bool        // the queue has flow limits: claim_flow claims it
	held    bool        // due jobs wait for their key's running jobs
	after   pgtype.Text // where claim_flow's next walk over the keys starts
	unkeyed pgtype.Bool // the claim took jobs without a key; NULL: it did not look
	// looked is when claim_flow last looked for jobs without a key, and
	// found whether it took some; freed is set by the claim loop when a
	// freed slot, not a wake-up, makes it claim.
	looked time.Time
	found  bool
	freed  bool
}

// claim takes up to limit due jobs, leases them, and returns their runs,
// tracked, for the caller to start (start). It claims from the cursor or
// from the front (internal/cursor), or, while the queue has flow limits,
// with claim_flow. A claim that finds the queue's limits declared or gone
// claims nothing: the other statement claims again at once. A claim from
// the front that expects few jobs (quiet) is lean (leanClaimSQL).
func (c *Claimer) claim(ctx context.Context, limit int) (machine.Result, []*runstate.Run) {
	r, runs, switched := c.claimOnce(ctx, limit)
	// A lean claim that took nothing while a job was due is followed by
	// the full claim, and that by claim_flow when the queue's limits began
	// meanwhile: three statements at most. A claim that found the limits
	// changed sets quiet false, so it is never followed by a lean one.
	for i := 0; switched && i < 2; i++ {
		r, runs, switched = c.claimOnce(ctx, limit)
	}
	return r, runs
}

// start starts the claimed runs on jobs.
func start(jobs *runners.Runners, runs []*runstate.Run) {
	for _, run := range runs {
		jobs.Start(run)
	}
}

// claimOnce is one claim statement. switched: the statement found the
// queue's flow limits declared or gone, or it was lean and took nothing
// while a job was due, and claimed nothing.
func (c *Claimer) claimOnce(ctx context.Context, limit int) (machine.Result, []*runstate.Run, bool) {
	r := machine.Result{Limit: limit}
	if c.lost.Pending() {
		c.giveBack(ctx)
		c.cursor.Reset() // the jobs given back may be behind it
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	c.claims.Add(1)
	conn, err := c.cfg.Pool.Acquire(ctx)
	if err != nil {
		c.cursor.Reset()
		return machine.Result{Limit: limit, Err: fmt.Errorf("claim jobs: %w", err)}, nil, false
	}
	defer conn.Release()
	notices := c.runs.Notices()
	var sent time.Time
	if c.trace != nil {
		sent = time.Now()
	}
	sql, args := c.claimSQL, []any{c.cfg.Queue, limit, c.cfg.WorkerID, c.cfg.Lease.Seconds(), c.cfg.MaxAttempts, c.cfg.ClaimBytes}
	flow, front, lookUnkeyed, lean := c.flow.limited, true, false, false
	switch {
	case flow:
		lookUnkeyed = !c.flow.freed || c.flow.found || time.Since(c.flow.looked) >= unkeyedEvery
		sql, args = c.flowSQL, append(args, c.flow.after, lookUnkeyed)
	default:
		if look, ok := c.looker.Looked(); ok {
			c.cursor.Looked(look)
		}
		if front = c.cursor.FromFront(); front {
			c.fronts.Add(1)
			if c.quiet {
				sql, lean = c.leanClaimSQL, true
			}
		} else {
			sql, args = c.claimCursorSQL, append(args, c.cursor.Priority, c.cursor.RunAt, c.cursor.ID)
		}
	}
	settings := pinned.ClaimPlanSQL
	if flow {
		settings = pinned.FlowPlanSQL
	}
	results := pinned.Send(ctx, conn, settings, sql, args...)
	if c.claimSent != nil {
		c.claimSent(c.cfg.Queue)
	}
	runs, at, took, fs, err := c.readClaim(results, &r)
	// Close reads the end of the transaction: only a committed claim runs.
	if closeErr := results.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("claim jobs: %w", closeErr)
	}
	if err != nil {
		c.cursor.Reset()
		if c.trace != nil {
			c.trace.Forget(runs)
		}
		// The server may have committed it: its jobs would stay running,
		// unrun, until their leases lapse. The next claim gives them back,
		// once the claim's session has ended its statement.
		if giveback.ReplyLost(err) {
			c.lost.Note(int32(conn.Conn().PgConn().PID()))
		}
		return machine.Result{Limit: limit, Err: err}, nil, false
	}
	if c.claimReturned != nil {
		for _, run := range runs {
			c.claimReturned(c.cfg.Queue, run.Job.ID)
		}
	}
	if fs.limited != flow {
		c.logger.Info("the queue's flow limits changed", zap.Bool("limited", fs.limited))
		c.flow = flowState{limited: fs.limited, freed: c.flow.freed}
		c.limited.Store(fs.limited)
		c.cursor.Reset()
		// The claim that follows is the last claim() makes: a lean one
		// that took nothing while a job is due would not say whether it
		// skipped locked ones, and the loop would sleep without looking
		// again.
		c.quiet = false
		return r, nil, true
	}
	if lean && len(runs) == 0 && !r.Paused && r.Next != nil && *r.Next <= 0 {
		// A due job it did not take: the full claim takes it, or says it
		// skipped locked ones, at once.
		c.quiet = false
		return r, nil, true
	}
	switch {
	case flow:
		c.flow.after, r.Held = fs.after, fs.held
		if lookUnkeyed && fs.unkeyed.Valid {
			c.flow.looked, c.flow.found = time.Now(), fs.unkeyed.Bool
		}
	case !r.Paused && c.cursor.Claimed(front, took, at, runs, len(runs) == limit):
		// A claim that found the queue paused read no row: it tells
		// neither where the due jobs are nor how long the front takes,
		// and it waits for resume_queue(), not for a look.
		c.looker.Want()
	}
	r.Claimed = len(runs)
	if r.Claimed == 0 {
		return r, nil, false
	}
	// The plain claim reads the next run_at and the skipped rows only when
	// it takes nothing (claimSQL).
	r.Untold = !flow && r.Claimed < limit
	if c.trace != nil {
		c.trace.Claimed(runs, limit, sent, time.Now())
	}
	c.runs.Add(runs)
	// A cancel notice heard since the claim was sent may name one of its
	// jobs, before its runs were known: the heartbeat finds out.
	if c.runs.Notices() != notices {
		c.heartbeat.Beat()
	}
	c.claimed.Add(int64(r.Claimed))
	c.logger.Debug("claimed jobs", zap.Int("num_claimed", r.Claimed))
	return r, runs, false
}

// readClaim reads a claim's results: the settings', then the claimed jobs,
// the claim's time on the database's clock and how long the server took,
// and into r the wait until the next run_at, whether due rows were skipped
// and whether the queue is paused.
func (c *Claimer) readClaim(results pgx.BatchResults, r *machine.Result) ([]*runstate.Run, time.Time, time.Duration, flowState, error) {
	var fs flowState
	if _, err := results.Exec(); err != nil {
		return nil, time.Time{}, 0, fs, fmt.Errorf("claim jobs: %w", err)
	}
	rows, err := results.Query()
	if err != nil {
		return nil, time.Time{}, 0, fs, fmt.Errorf("claim jobs: %w", err)
	}
	defer rows.Close()
	claimed := make([]*runstate.Run, 0, min(r.Limit, maxClaimedCap))
	// Value types, not pointers: a pointer per column and row was a tenth
	// of the worker's CPU in a drain (pprof). Only the row of a claim that
	// found nothing has NULLs.
	var (
		id                   pgtype.Int8
		kind                 pgtype.Text
		priority             pgtype.Int2
		attempt, maxAttempts pgtype.Int4
		runAt, createdAt     pgtype.Timestamptz
		claimedAt, at        pgtype.Timestamptz
		nextIn, took         pgtype.Float8
		stranded, paused     pgtype.Bool
		limited, held        pgtype.Bool
		payload              []byte
		traceParent          pgtype.Text
		traceState           pgtype.Text
	)
	// The writer's trace context is read only with tracing on: a nil
	// destination skips its column.
	var traceDest [2]any
	if c.trace != nil {
		traceDest = [2]any{&traceParent, &traceState}
	}
	// One destination list for every row: a list built at each Scan went
	// to the heap at each row (320 bytes a job in a drain, pprof).
	dest := []any{
		&id, &kind, &payload, &priority, &attempt, &maxAttempts, &runAt, &createdAt,
		&claimedAt, &nextIn, &stranded, &paused, &at, &took,
		traceDest[0], traceDest[1], &limited, &held, &fs.after, &fs.unkeyed,
	}
	// The claim's own columns are the same in every row: read from the
	// first.
	first := true
	for rows.Next() {
		payload = nil // a new slice per row: the scan would reuse the last one
		if err := rows.Scan(dest...); err != nil {
			return nil, time.Time{}, 0, fs, fmt.Errorf("claim jobs: scan: %w", err)
		}
		if first {
			first = false
			for _, i := range claimColumns {
				dest[i] = nil
			}
			fs.limited, fs.held = limited.Bool, held.Bool
			if nextIn.Valid {
				d := scheduleWait(nextIn.Float64)
				r.Next = &d
			}
			r.Stranded = stranded.Valid && stranded.Bool
			r.Paused = paused.Valid && paused.Bool
		}
		if !id.Valid {
			continue // the one row of a claim that found nothing
		}
		claimed = append(claimed, &runstate.Run{ClaimedAt: claimedAt.Time, Job: &executors.Job{
			ID: id.Int64, Queue: c.cfg.Queue, Kind: kind.String, Payload: payload, Priority: priority.Int16,
			Attempt: int(attempt.Int32), MaxAttempts: int(maxAttempts.Int32), RunAt: runAt.Time, CreatedAt: createdAt.Time,
		}})
		if c.trace != nil && traceParent.Valid {
			c.trace.Writer(claimed[len(claimed)-1], traceParent.String, traceState.String)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, 0, fs, fmt.Errorf("claim jobs: %w", err)
	}
	return claimed, at.Time, time.Duration(took.Float64 * float64(time.Second)), fs, nil
}

// claimColumns are the places in readClaim's destinations of the claim's
// own columns, read from the first row only.
var claimColumns = [...]int{9, 10, 11, 12, 13, 16, 17, 18, 19}

// maxClaimedCap bounds the room readClaim makes ahead for a claim's runs.
const maxClaimedCap = 1024

// scheduleWait turns the seconds until the earliest future run_at into a
// wait, capped at machine.MaxScheduleWait: a job due in the year 9999 is further
// away than a time.Duration reaches, and the conversion would overflow to a
// negative wait, a claim every millisecond. The fallback tick comes sooner
// than the cap anyway. A run_at due already (the lean claim's first run_at)
// is a wait of 0, however far back: the year 1 is past what a
// time.Duration holds too.
func scheduleWait(seconds float64) time.Duration {
	if !(seconds < machine.MaxScheduleWait.Seconds()) { // also NaN
		return machine.MaxScheduleWait
	}
	if seconds <= 0 {
		return 0
	}
	return time.Duration(seconds * float64(time.Second))
}

// giveBack gives back the jobs of the claims whose replies were lost,
// sparing the jobs of the claimer's runs. It runs on the claim loop,
// between claims, so that every claim whose reply was read has its runs
// known to the tracker.
func (c *Claimer) giveBack(ctx context.Context) {
	runs := c.runs.Inflight()
	ids := make([]int64, len(runs))
	for i, r := range runs {
		ids[i] = r.Job.ID
	}
	c.lost.GiveBack(ctx, ids)
}

package claimer

import (
	"strings"

	"github.com/pgdispatch/pgdispatch/internal/xidsql"
)

// The queries name the jobs table through {jobs}, replaced once per claimer
// by the quoted identifier. Every multi-row write first locks its rows in id
// order (the l CTE), so two writers can never deadlock on them.

// claimSQL claims up to $2 due jobs of queue $1. When it claims fewer than
// asked, the queue is drained of due work and it also returns how many
// seconds remain until the earliest future run_at, so the claimer knows how
// long it may sleep. The wait is measured on the database's clock: a worker
// whose clock ran ahead would otherwise wake early, find nothing due, and
// claim again and again until the clocks agreed.
//
// The claim commits asynchronously (claimPlanSQL sets synchronous_commit
// for the claim's own transaction, read when it commits): it does not wait for its WAL flush,
// which under load was most of a claim's time (p50 2.3 ms of 2.3 ms with four
// writers). A claim lost in a server crash leaves its jobs pending, so they
// run again: at least once still holds. Outcomes are written synchronously.
//
// The UPDATE finds its rows by the ctids c locked, ctid = ANY(ARRAY(...)),
// not by joining c: a prepared statement's generic plan cannot see LIMIT $2,
// and planned that join as a hash join over a sequential scan of the whole
// table. A ctid goes straight to the row, where an id went down the primary
// key first: claims executed 10 % faster in drains (pg_stat_statements,
// three pairs of runs). The ctid is the version c locked (when a concurrent
// update came first, FOR UPDATE follows it to the newest version and checks
// it again), and no other transaction can move a row this one has locked.
//
// Like heldClaimSQL, it counts the attempt of a held claim that was lost
// (the lost mark, read before the row was locked).
const claimSQL = `
WITH c AS (
    SELECT ctid, {lost} AS lost FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE {jobs} j
    SET status = 'running',
        attempts = j.attempts + 1 + (j.ctid = ANY(ARRAY(SELECT ctid FROM c WHERE lost)))::int,
        max_attempts = coalesce(j.max_attempts, $5),
        locked_by = $3,
        locked_until = now() + make_interval(secs => $4::float8),
        updated_at = now()
    WHERE j.ctid = ANY(ARRAY(SELECT ctid FROM c))
    RETURNING j.id, j.kind, j.payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at
), n AS (
    SELECT extract(epoch FROM min(run_at) - now())::float8 AS next_in FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at > now()
      AND (SELECT count(*) FROM u) < $2
)
SELECT u.id, u.kind, u.payload, u.priority, u.attempts, u.max_attempts, u.run_at, u.created_at, n.next_in
FROM n LEFT JOIN u ON true`

// planSQL goes before each claim, heartbeat and completion, in the same
// implicit transaction (one pipeline, one Sync), and pins their plans:
//
//   - A generic plan, planned once per connection. Left to itself,
//     PostgreSQL planned the claim anew at every call (the custom plan, which
//     sees LIMIT $2, always looked cheaper), 0.47 ms of a 2.3 ms claim
//     (pg_stat_statements with track_planning, during a drain).
//   - Rows found by key, never by a scan of the table. A generic plan is
//     kept for the connection's life, and one planned while the table was
//     nearly empty (a worker started on a new queue) used sequential scans
//     and hash joins, and went on using them as the table grew: a completion
//     scanned every retained row, 8.8 ms on average with 16 writers.
//     Without sequential scans, hash and merge joins, these statements have
//     one plan left: a nested loop over the batch, by primary key (by ctid
//     for the claim's UPDATE, so TID scans are turned on: on a server that
//     turned them off, a generic plan made on an empty table scanned it).
//
// The settings are the transaction's own and never leak into the pool.
// plan_test.go checks the plans, planned on an empty table, on stale
// statistics and with TID scans off.
const planSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_tidscan', 'on', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true)`

// claimPlanSQL is planSQL for the claim, which also commits without waiting
// for its WAL flush.
const claimPlanSQL = planSQL + `,
       set_config('synchronous_commit', 'off', true)`

// heartbeatSQL extends the leases of this worker's running jobs $1. Like
// completeSQL, it locks only the rows that are still this worker's.
const heartbeatSQL = `
WITH l AS (
    SELECT id FROM {jobs}
    WHERE id = ANY($1::bigint[]) AND (status = 'running' AND locked_by = $2) IS TRUE
    ORDER BY id
    FOR UPDATE
)
UPDATE {jobs} j SET locked_until = now() + make_interval(secs => $3::float8)
FROM l WHERE j.id = l.id`

// completeSQL records a batch of outcomes in one statement.
//
// Each row applies only while the job is still this worker's attempt, so a
// completion that lost its lease to the sweeper changes nothing. With $7
// true, done jobs are deleted instead of kept. A released job (status
// pending, release true) gives back its attempt: shutdown interrupted it.
//
// Only the rows that are still this worker's are locked, and in id order.
// A row that is not is left alone: its lock would replace the row's xmax,
// and with it the mark of a lost held claim that lostSQL reads, with this
// transaction's, which commits. The attempt that claim lost would then go
// uncounted.
//
// Rows are found by id alone. The guard is wrapped in IS TRUE, which no
// index can serve: with statistics taken while few jobs ran, the planner
// estimated one running row and, given a guard it could look up, drove the
// batch from a scan for status = 'running' in a nested loop, quadratic in
// the batch (about 1 s for 1,000 rows, 15 ms by id).
const completeSQL = `
WITH v AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::float8[], $5::text[], $6::bool[])
        AS v(id, attempt, status, delay, err, release)
), l AS (
    SELECT j.id, v.status, v.delay, v.err, v.release
    FROM v JOIN {jobs} j ON j.id = v.id
    WHERE (j.status = 'running' AND j.locked_by = $8 AND j.attempts = v.attempt) IS TRUE
    ORDER BY j.id
    FOR UPDATE OF j
), d AS (
    DELETE FROM {jobs} j USING l
    WHERE j.id = l.id AND $7 AND l.status = 'done'
)
UPDATE {jobs} j
SET status = l.status,
    run_at = CASE WHEN l.status = 'pending' THEN now() + make_interval(secs => l.delay) ELSE j.run_at END,
    attempts = CASE WHEN l.release THEN j.attempts - 1 ELSE j.attempts END,
    last_error = coalesce(l.err, j.last_error),
    finished_at = CASE WHEN l.status IN ('done', 'dead') THEN now() END,
    locked_by = NULL,
    locked_until = NULL,
    updated_at = now()
FROM l
WHERE j.id = l.id AND NOT ($7 AND l.status = 'done')`

// lostSQL is true for a row whose xmax, read as it was before this claim
// locked the row, belongs to a transaction that did not commit: most likely
// a held claim lost with its worker or its connection. PostgreSQL leaves a
// locker's xmax on the row when its transaction ends, so it can be read: a
// row locked and then written in a transaction that committed carries that
// transaction's xid (committed), a new row carries none (0), and a lost held
// claim's xid reads as aborted (a crash counts as an abort).
//
// A locker still in progress counts too. The mark is read by the scan,
// before FOR UPDATE SKIP LOCKED tries the row's lock, and the locker can end
// in between: a held claim whose connection was just closed or terminated
// reads as in progress and then lets go of the row, and the claim gets it.
// Read as "not lost", that attempt went uncounted (the e2e suite's
// terminate scenario caught it: a job delivered twice in one attempt). A
// locker that still holds the row when the lock is tried makes the claim
// skip the row, and then the mark is not used; one that ended by committing
// a write changed the row, and FOR UPDATE reads the new version, and its
// mark, again. Only a lock-only locker that committed in that gap (a user's
// SELECT FOR UPDATE) counts an attempt that did not run.
//
// xmax is 32 bits; xidsql.Xid8 makes it the xid8 that pg_xact_status takes,
// in the current transaction's epoch. A value that is not a plain xid (a
// MultiXactId, left by several lockers at once, such as a held claim and a
// foreign key's KEY SHARE) reads as some other transaction's status: an
// attempt may then be counted that did not run, or a lost one missed. An
// xid too old for the commit log reads NULL: not lost. Other
// aborted writers and lockers leave the mark too (a claim whose transaction
// failed after it locked its rows, a user's SELECT FOR UPDATE that rolled
// back); for those an attempt is counted that did not run.
var lostSQL = `CASE WHEN xmax = '0'::xid THEN false ELSE coalesce(pg_xact_status(` +
	xidsql.Xid8("xmax", "pg_current_xact_id()::text::bigint") + `) <> 'committed', false) END`

// The arguments of each statement, built in one place for its use and for
// the warm-up (warm.go), which runs every statement once with arguments that
// match no row.

// claimArgs are claimSQL's arguments: up to limit jobs.
func (c *Claimer) claimArgs(limit int) []any {
	return []any{c.cfg.Queue, limit, c.cfg.WorkerID, c.cfg.Lease.Seconds(), c.cfg.MaxAttempts}
}

// heldClaimArgs are heldClaimSQL's arguments: up to limit jobs.
func (c *Claimer) heldClaimArgs(limit int) []any {
	return []any{c.cfg.Queue, limit, c.cfg.MaxAttempts}
}

// heldCompleteArgs are heldCompleteSQL's arguments: the outcomes a.
func (c *Claimer) heldCompleteArgs(a outcomeArrays) []any {
	return []any{a.ids, a.attempts, a.statuses, a.delays, a.errs, a.releases, c.cfg.DeleteDone, c.cfg.MaxAttempts}
}

// leaseHeldArgs are leaseHeldSQL's arguments: the jobs ids with their
// attempts.
func (c *Claimer) leaseHeldArgs(ids []int64, attempts []int32) []any {
	return []any{ids, attempts, c.cfg.WorkerID, c.cfg.Lease.Seconds(), c.cfg.MaxAttempts}
}

// completeArgs are completeSQL's arguments: the outcomes a.
func (c *Claimer) completeArgs(a outcomeArrays) []any {
	return []any{a.ids, a.attempts, a.statuses, a.delays, a.errs, a.releases, c.cfg.DeleteDone, c.cfg.WorkerID}
}

// heartbeatArgs are heartbeatSQL's arguments: the leases of jobs ids.
func (c *Claimer) heartbeatArgs(ids []int64) []any {
	return []any{ids, c.cfg.WorkerID, c.cfg.Lease.Seconds()}
}

// heldClaimPastArgs are heldClaimSQL's arguments, with pastSQL, for a claim
// of up to limit jobs past from.
func (c *Claimer) heldClaimPastArgs(limit int, from claimKey) []any {
	return append(c.heldClaimArgs(limit), from.priority, from.runAt, from.id)
}

// withTable names the jobs table in sql. A held claim starts at the front
// of the queue; withPast makes it start past a row.
func withTable(sql, jobsTable string) string {
	return strings.NewReplacer("{jobs}", jobsTable, "{lost}", lostSQL, "{past}", "").Replace(sql)
}

func withPast(sql string) string { return strings.Replace(sql, "{past}", pastSQL, 1) }

// heldClaimSQL is the claim of a held batch (held.go): it locks up to $2 due
// jobs of queue $1 with FOR UPDATE SKIP LOCKED and writes nothing. The
// claim's transaction stays open while the jobs run, and its row locks keep
// them from every other claimer; the outcomes are written in it, so a job
// done within Config.Hold costs one write, not two. Its result has
// claimSQL's columns and one more, lost.
//
// lost marks a row that an earlier claim locked and then lost (lostSQL):
// that attempt may have run but was never written, so the one this claim
// returns counts it too, and the claimer leases such a batch at once instead
// of holding it (held.go). Otherwise a job that kills its worker would be
// held, and lost, for ever, and run more often than its attempts say.
const heldClaimSQL = `
WITH c AS (
    SELECT id, kind, payload, priority,
           attempts + 1 + ({lost})::int AS attempt,
           coalesce(max_attempts, $3) AS max_attempts, run_at, created_at,
           {lost} AS lost
    FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at <= now(){past}
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), n AS (
    SELECT extract(epoch FROM min(run_at) - now())::float8 AS next_in FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at > now()
      AND (SELECT count(*) FROM c) < $2
)
SELECT c.id, c.kind, c.payload, c.priority, c.attempt, c.max_attempts, c.run_at, c.created_at, n.next_in, c.lost
FROM n LEFT JOIN c ON true`

// pastSQL makes heldClaimSQL a claim that starts past the row ($4, $5, $6:
// its priority, run_at and id) where the last full claim ended, rather
// than at the front of the queue (resume in held.go). The bound is in the
// index condition, so the scan starts there and no longer steps over the
// rows this claimer's open batches hold. Each of those cost a lock tried
// and skipped, about 2 µs: a claim of 100 behind 400 locked rows took
// 1.6 ms, against 0.8 ms with none (EXPLAIN ANALYZE), and in a drain two or
// three batches of 100 are still committing at each claim.
const pastSQL = `
      AND (priority, run_at, id) > ($4::smallint, $5::timestamptz, $6::bigint)`

// heldCompleteSQL records the outcomes of held jobs in their claim's
// transaction. The rows are still pending and already locked by it, so
// nothing else can have changed them and no guard is needed; and no lock is
// waited for, so the order of the rows cannot deadlock. The attempt the
// claim handed out is written here, as the leased claim writes it at claim
// time, except for a job given back at shutdown.
const heldCompleteSQL = `
WITH v AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::float8[], $5::text[], $6::bool[])
        AS v(id, attempt, status, delay, err, release)
), d AS (
    DELETE FROM {jobs} j USING v
    WHERE j.id = v.id AND $7 AND v.status = 'done'
)
UPDATE {jobs} j
SET status = v.status,
    run_at = CASE WHEN v.status = 'pending' THEN now() + make_interval(secs => v.delay) ELSE j.run_at END,
    attempts = CASE WHEN v.release THEN v.attempt - 1 ELSE v.attempt END,
    max_attempts = coalesce(j.max_attempts, $8),
    last_error = coalesce(v.err, j.last_error),
    finished_at = CASE WHEN v.status IN ('done', 'dead') THEN now() END,
    updated_at = now()
FROM v
WHERE j.id = v.id AND NOT ($7 AND v.status = 'done')`

// leaseHeldSQL leases held jobs $1 with their attempts $2, as claimSQL would
// have claimed them: the ones still running when Hold ends, and a whole
// batch that holds a lost row. From then on the heartbeat renews their
// leases and the completer records them.
const leaseHeldSQL = `
UPDATE {jobs} j
SET status = 'running',
    attempts = v.attempt,
    max_attempts = coalesce(j.max_attempts, $5),
    locked_by = $3,
    locked_until = now() + make_interval(secs => $4::float8),
    updated_at = now()
FROM unnest($1::bigint[], $2::int[]) AS v(id, attempt)
WHERE j.id = v.id`

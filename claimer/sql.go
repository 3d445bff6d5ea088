package claimer

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// The queries name the tables through {jobs} and {queues}, replaced once
// per claimer by the quoted identifiers. Every multi-row write first locks its rows in id
// order, so two writers can never deadlock on them.

// claimSQL claims up to $2 due jobs of queue $1 for worker $3, under a lease
// of $4 seconds ($5: the attempts of a job whose max_attempts is NULL), in
// (priority, run_at, id) order, until their payloads' size passes $6 bytes
// (one job at least; a compressed payload is measured decompressed).
// attempts stops at 1,000,000, the constraint's bound, so that no row the
// table accepts makes the claim fail. Its updated_at, now(), marks the claim:
// the outcome is written only while the row still carries it.
//
// It claims nothing while the queue is paused (a row in the queues table
// with paused_at set), and says so.
//
// When it claims fewer than asked, it also returns the seconds until the
// earliest future run_at, on the database's clock, and whether it skipped
// due rows: its snapshot sees the rows it claimed as pending, so more due
// rows than it claimed means some were locked by another transaction.
//
// It commits without waiting for its WAL flush (claimPlanSQL): a claim lost
// in a server crash leaves its jobs pending, and they run again. The UPDATE
// finds its rows by the ctids c locked rather than by joining c, whose
// generic plan, blind to LIMIT $2, was a hash join over the whole table.
const claimSQL = `
WITH p AS (
    SELECT EXISTS (SELECT FROM {queues} WHERE name = $1 AND paused_at IS NOT NULL) AS paused
), c AS (
    SELECT ctid, priority, run_at, id,
           CASE WHEN pg_column_compression(payload) IS NULL THEN pg_column_size(payload)
                ELSE pg_column_size(payload || '{}'::jsonb) END AS size
    FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at <= now() AND NOT (SELECT paused FROM p)
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), u AS (
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
    RETURNING j.id, j.kind, j.payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.updated_at
), k AS (
    SELECT count(*) AS claimed FROM u
), n AS (
    SELECT CASE WHEN k.claimed < $2 AND NOT p.paused THEN
               (SELECT extract(epoch FROM min(run_at) - now())::float8 FROM {jobs}
                WHERE status = 'pending' AND queue = $1 AND run_at > now())
           END AS next_in,
           CASE WHEN k.claimed < $2 AND NOT p.paused THEN
               (SELECT count(*) FROM (SELECT FROM {jobs}
                                      WHERE status = 'pending' AND queue = $1 AND run_at <= now()
                                      LIMIT $2 + 1) d) > k.claimed
           END AS stranded,
           p.paused
    FROM k, p
)
SELECT u.id, u.kind, u.payload, u.priority, u.attempts, u.max_attempts, u.run_at, u.created_at,
       u.updated_at, n.next_in, n.stranded, n.paused
FROM n LEFT JOIN u ON true`

// planSQL goes before each claim, heartbeat and completion, in the same
// implicit transaction, and pins their plans: a generic plan, made once per
// connection (else the claim was planned anew at every call), that finds
// rows by key only, however the statistics looked when it was made (a plan
// made on a nearly empty table scanned the whole table ever after). The
// settings are the transaction's own. plan_test.go checks the plans.
const planSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_tidscan', 'on', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true)`

// claimPlanSQL is planSQL for the claim, which also commits without waiting
// for its WAL flush.
const claimPlanSQL = planSQL + `,
       set_config('synchronous_commit', 'off', true)`

// The statements below write a batch of rows found by id in the order of
// their arrays, which the claimer sorts by id: under planSQL their one plan
// is a nested loop over the arrays, by primary key, so they lock their rows
// in id order, and lock each once, as they write it. A row is written only
// while it is still this worker's attempt: the guard, wrapped in IS TRUE,
// which no index can serve, so that the planner never drives the batch
// from a scan for running rows (with stale statistics it did, quadratic in
// the batch). A row whose guard fails is left alone: its lease was lost to
// the sweeper, or an operator cancelled it. The guard names the claim by
// the updated_at it wrote: a claim lost in a server crash (it commits
// without waiting for its WAL flush) can be made again by the same worker
// with the same attempt number, and the first run's outcome must not pass
// for the second's.

// heartbeatSQL extends the leases of this worker's running jobs $1 of
// claims $2, and returns the positions (from 1) in $1 of those it renewed.
// A job claimed twice here (its first lease lost, then claimed again) is
// renewed for the claim its row carries, and only for that one.
const heartbeatSQL = `
UPDATE {jobs} j SET locked_until = now() + make_interval(secs => $4::float8)
FROM unnest($1::bigint[], $2::timestamptz[]) WITH ORDINALITY AS v(id, claimed_at, n)
WHERE j.id = v.id AND (j.status = 'running' AND j.locked_by = $3 AND j.updated_at = v.claimed_at) IS TRUE
RETURNING v.n`

// completeSQL records a batch of outcomes: $3 is done, pending (a retry,
// or a release: an attempt given back at shutdown or snoozed, $6) or dead.
// A failed attempt's entry ($7, JSON) is appended to errors after the last
// 19 before it, so that errors holds the last 20 (as cancel() in migration
// 010 does), and a done job's result ($8, JSON, NULL for none) is stored.
const completeSQL = `
UPDATE {jobs} j
SET status = v.status,
    run_at = CASE WHEN v.status = 'pending' THEN now() + make_interval(secs => v.delay) ELSE j.run_at END,
    attempts = CASE WHEN v.release THEN j.attempts - 1 ELSE j.attempts END,
    last_error = coalesce(v.err, j.last_error),
    errors = CASE WHEN v.entry IS NULL THEN j.errors
                  ELSE jsonb_path_query_array(coalesce(j.errors, '[]'), '$[last - 18 to last]') || v.entry::jsonb END,
    result = CASE WHEN v.status = 'done' THEN v.result::jsonb ELSE j.result END,
    finished_at = CASE WHEN v.status IN ('done', 'dead') THEN now() END,
    locked_by = NULL,
    locked_until = NULL,
    updated_at = now()
FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::float8[], $5::text[], $6::bool[], $7::text[], $8::text[])
    AS v(id, claimed_at, status, delay, err, release, entry, result)
WHERE j.id = v.id AND (j.status = 'running' AND j.locked_by = $9 AND j.updated_at = v.claimed_at) IS TRUE`

// deleteDoneSQL deletes done jobs $1 of claims $2, when done jobs are not
// kept (RETAIN_DONE=0).
const deleteDoneSQL = `
DELETE FROM {jobs} j
USING unnest($1::bigint[], $2::timestamptz[]) AS v(id, claimed_at)
WHERE j.id = v.id AND (j.status = 'running' AND j.locked_by = $3 AND j.updated_at = v.claimed_at) IS TRUE`

// notOwnedSQL returns the positions (from 1) in $1 of those of the jobs $1
// of claims $2 whose rows no longer carry that claim under worker $3:
// cancelled, given back, claimed again, or gone.
const notOwnedSQL = `
SELECT v.n FROM unnest($1::bigint[], $2::timestamptz[]) WITH ORDINALITY AS v(id, claimed_at, n)
WHERE NOT EXISTS (SELECT FROM {jobs} j
                  WHERE j.id = v.id AND j.status = 'running' AND j.locked_by = $3 AND j.updated_at = v.claimed_at)`

// withSchema names schema's tables in sql: {jobs} and {queues}.
func withSchema(sql, schema string) string {
	return strings.NewReplacer("{jobs}", pgx.Identifier{schema, "jobs"}.Sanitize(),
		"{queues}", pgx.Identifier{schema, "queues"}.Sanitize()).Replace(sql)
}

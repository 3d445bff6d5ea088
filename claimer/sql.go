package claimer

import "strings"

// The queries name the jobs table through {jobs}, replaced once per claimer
// by the quoted identifier. Every multi-row write first locks its rows in id
// order (the l CTE), so two writers can never deadlock on them.

// claimSQL claims up to $2 due jobs of queue $1. When it claims fewer than
// asked, the queue is drained of due work and it also returns the earliest
// future run_at, so the claimer knows how long it may sleep.
const claimSQL = `
WITH c AS (
    SELECT id FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE {jobs} j
    SET status = 'running',
        attempts = j.attempts + 1,
        max_attempts = coalesce(j.max_attempts, $5),
        locked_by = $3,
        locked_until = now() + make_interval(secs => $4::float8),
        updated_at = now()
    FROM c WHERE j.id = c.id
    RETURNING j.id, j.kind, j.payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at
), n AS (
    SELECT min(run_at) AS next_run_at FROM {jobs}
    WHERE status = 'pending' AND queue = $1 AND run_at > now()
      AND (SELECT count(*) FROM u) < $2
)
SELECT u.id, u.kind, u.payload, u.priority, u.attempts, u.max_attempts, u.run_at, u.created_at, n.next_run_at
FROM n LEFT JOIN u ON true`

// heartbeatSQL extends the leases of this worker's running jobs $1.
const heartbeatSQL = `
WITH l AS (
    SELECT id FROM {jobs}
    WHERE id = ANY($1::bigint[]) AND status = 'running' AND locked_by = $2
    ORDER BY id
    FOR UPDATE
)
UPDATE {jobs} j SET locked_until = now() + make_interval(secs => $3::float8)
FROM l WHERE j.id = l.id`

// completeSQL records a batch of outcomes in one statement. Each row applies
// only while the job is still this worker's attempt, so a completion that
// lost its lease to the sweeper changes nothing. With $7 true, done jobs are
// deleted instead of kept. A released job (status pending, delay 0, release
// true) gives back its attempt: it was interrupted by shutdown, not failed.
const completeSQL = `
WITH v AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::float8[], $5::text[], $6::bool[])
        AS v(id, attempt, status, delay, err, release)
), l AS (
    SELECT j.id FROM {jobs} j JOIN v ON v.id = j.id
    WHERE j.status = 'running' AND j.locked_by = $8 AND j.attempts = v.attempt
    ORDER BY j.id
    FOR UPDATE OF j
), d AS (
    DELETE FROM {jobs} j USING l, v
    WHERE $7 AND j.id = l.id AND v.id = l.id AND v.status = 'done'
)
UPDATE {jobs} j
SET status = v.status,
    run_at = CASE WHEN v.status = 'pending' THEN now() + make_interval(secs => v.delay) ELSE j.run_at END,
    attempts = CASE WHEN v.release THEN j.attempts - 1 ELSE j.attempts END,
    last_error = coalesce(v.err, j.last_error),
    finished_at = CASE WHEN v.status IN ('done', 'dead') THEN now() END,
    locked_by = NULL,
    locked_until = NULL,
    updated_at = now()
FROM l JOIN v ON v.id = l.id
WHERE j.id = l.id AND NOT ($7 AND v.status = 'done')`

func withTable(sql, jobsTable string) string {
	return strings.ReplaceAll(sql, "{jobs}", jobsTable)
}

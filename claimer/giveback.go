package claimer

import (
	"context"
	"errors"
	"net"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/internal/retry"
)

// giveBackSQL gives back the jobs of queue $1 that a claim of worker $2,
// under a lease of $3 seconds, left running with no run to hold them: a
// claim whose reply was lost. Its rows read running, locked_by this
// worker, and a lease not yet lapsed (else the row is the sweeper's) and
// never renewed (locked_until is the claim's updated_at plus the lease: no
// heartbeat has touched it), and none of them is a job of this claimer's
// runs ($4): those are the heartbeat's and the completer's. No executor
// started on them, since the claimer never saw them, so each attempt is
// given back and the job is pending again, due as before. It locks them
// in id order, found by the lease's index; the UPDATE then takes each by
// its key (its guard, wrapped in IS TRUE as the completer's, serves no
// index).
//
// It acts only once the sessions $5 of the lost claims have ended their
// statements (they are idle, or gone): a claim still running on the
// server would commit after it. It returns whether they had, and how many
// jobs it gave back.
const giveBackSQL = `
WITH s AS (
    SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_stat_activity
                       WHERE pid = ANY($5::int4[]) AND state IS DISTINCT FROM 'idle') AS ended
), u AS (
    UPDATE {jobs} j
    SET status = 'pending',
        attempts = greatest(j.attempts - 1, 0),
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE j.id = ANY(ARRAY(
            SELECT id FROM {jobs}
            WHERE (SELECT ended FROM s) AND queue = $1 AND status = 'running' AND locked_by = $2
              AND locked_until > now() AND locked_until = updated_at + make_interval(secs => $3::float8)
              AND id <> ALL($4::bigint[])
            ORDER BY id
            FOR UPDATE))
      AND (j.status = 'running' AND j.locked_by = $2) IS TRUE
    RETURNING 1
)
SELECT (SELECT ended FROM s), (SELECT count(*) FROM u)`

// maxLost bounds the lost claims' sessions the claimer waits for.
const maxLost = 64

// replyLost reports whether err, a failed claim's, leaves the claim
// unknown: its statement was sent and the connection failed (it died, or
// the call timed out) before the reply was read, so the server may have
// committed it.
func replyLost(err error) bool {
	var connectErr *pgconn.ConnectError
	if err == nil || pgconn.SafeToRetry(err) || errors.As(err, &connectErr) {
		return false
	}
	var netErr net.Error
	return retry.ConnLost(err) || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr)
}

// giveBack gives back the jobs of lost claims, as giveBackSQL says, and
// reports whether it could: until then the claimer tries again before
// each claim. It runs on the claim loop, between claims, so that every
// claim whose reply was read has its runs known to the tracker.
func (c *Claimer) giveBack(ctx context.Context) bool {
	runs := c.runs.Inflight()
	ids := make([]int64, len(runs))
	for i, r := range runs {
		ids[i] = r.Job.ID
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	results := pinned.Send(ctx, c.cfg.Pool, pinned.PlanSQL, c.giveBackSQL,
		c.cfg.Queue, c.cfg.WorkerID, c.cfg.Lease.Seconds(), ids, c.lost)
	var (
		ended bool
		n     int64
	)
	_, err := results.Exec()
	if err == nil {
		err = results.QueryRow().Scan(&ended, &n)
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	switch {
	case err != nil:
		c.logger.Warn("giving back the jobs of a claim whose reply was lost failed", zap.Error(err))
		return false
	case !ended:
		c.logger.Debug("a claim whose reply was lost is still running on the server: its jobs are given back later")
		return false
	case n > 0:
		c.logger.Warn("a claim's reply was lost after it committed: its jobs are given back, their attempts uncounted",
			zap.Int64("num_jobs", n))
	}
	return true
}

// lostClaim notes the session of a claim whose reply was lost.
func (c *Claimer) lostClaim(pid int32) {
	if !slices.Contains(c.lost, pid) && len(c.lost) < maxLost {
		c.lost = append(c.lost, pid)
	}
}

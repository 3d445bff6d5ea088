// Package giveback gives back the jobs of a claim whose reply was lost:
// its statement was sent and the connection failed before the reply was
// read, so the server may have committed it. Its jobs would stay running,
// unrun, until their leases lapsed; before its next claim, the claimer
// gives them back, their attempts uncounted, since no executor started on
// them.
package giveback

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/internal/retry"
)

// SQL gives back the jobs of queue $1 that a claim of worker $2, under a
// lease of $3 seconds, left running with no run to hold them: a claim
// whose reply was lost. Its rows read running, locked_by this worker, and
// a lease not yet lapsed (else the row is the sweeper's) and never renewed
// (locked_until is the claim's updated_at plus the lease: no heartbeat has
// touched it), and none of them is a job of this claimer's runs ($4):
// those are the heartbeat's and the completer's. No executor started on
// them, since the claimer never saw them, so each attempt is given back
// and the job is pending again, due as before. It locks them in id order,
// found by the lease's index; the UPDATE then takes each by its key (its
// guard, wrapped in IS TRUE as the completer's, serves no index).
//
// It acts only once the sessions $5 of the lost claims have ended their
// statements (they are idle, or gone): a claim still running on the
// server would commit after it. It returns whether they had, and how many
// jobs it gave back.
const SQL = `
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

// maxSessions bounds the lost claims' sessions waited for.
const maxSessions = 64

// ReplyLost reports whether err, a failed claim's, leaves the claim
// unknown: its statement was sent and the connection failed (it died, or
// the call timed out) before the reply was read, so the server may have
// committed it.
func ReplyLost(err error) bool {
	var connectErr *pgconn.ConnectError
	if err == nil || pgconn.SafeToRetry(err) || errors.As(err, &connectErr) {
		return false
	}
	var netErr net.Error
	return retry.ConnLost(err) || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr)
}

// Config configures Lost. Every field is required.
type Config struct {
	Pool             *pgxpool.Pool
	Schema           string
	Queue            string
	WorkerID         string
	Lease            time.Duration
	StatementTimeout time.Duration
	Logger           *zap.Logger
}

// Lost holds the lost claims of one claimer whose jobs are not given back
// yet. It is used by the claim loop alone.
type Lost struct {
	cfg      Config
	sql      string
	sessions []int32 // the sessions of the lost claims
}

// New returns an empty Lost.
func New(cfg Config) *Lost {
	return &Lost{cfg: cfg, sql: pinned.WithSchema(SQL, cfg.Schema)}
}

// Note notes the session of a claim whose reply was lost.
func (l *Lost) Note(pid int32) {
	if !slices.Contains(l.sessions, pid) && len(l.sessions) < maxSessions {
		l.sessions = append(l.sessions, pid)
	}
}

// Pending reports whether a lost claim's jobs are still to be given back.
func (l *Lost) Pending() bool { return len(l.sessions) > 0 }

// GiveBack gives back the jobs of the lost claims, as SQL says, sparing the
// jobs running (the ids of the claimer's runs), and reports whether it
// could; until then the claimer tries again before each claim. It must run
// between claims, so that every claim whose reply was read has its runs in
// running.
func (l *Lost) GiveBack(ctx context.Context, running []int64) bool {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StatementTimeout)
	defer cancel()
	results := pinned.Send(ctx, l.cfg.Pool, pinned.PlanSQL, l.sql,
		l.cfg.Queue, l.cfg.WorkerID, l.cfg.Lease.Seconds(), running, l.sessions)
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
		l.cfg.Logger.Warn("giving back the jobs of a claim whose reply was lost failed", zap.Error(err))
		return false
	case !ended:
		l.cfg.Logger.Debug("a claim whose reply was lost is still running on the server: its jobs are given back later")
		return false
	case n > 0:
		l.cfg.Logger.Warn("a claim's reply was lost after it committed: its jobs are given back, their attempts uncounted",
			zap.Int64("num_jobs", n))
	}
	l.sessions = l.sessions[:0]
	return true
}

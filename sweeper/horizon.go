package sweeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// The thresholds past which the database's oldest snapshot is warned of.
const (
	// HorizonWarnAge is how long ago the transaction that holds it began.
	HorizonWarnAge = 5 * time.Minute
	// HorizonWarnXids is how many transactions have begun since it was
	// taken: about one per claim and one per batch of outcomes.
	HorizonWarnXids = 1_000_000
)

// Horizon is the database's oldest snapshot that holds back vacuum in the
// jobs table, and who holds it.
type Horizon struct {
	// Seconds since the transaction that holds it began (a prepared
	// transaction: since it was prepared); 0 for a replication slot, which
	// does not say.
	Seconds float64
	// XidAge is how many transactions have begun since the snapshot was
	// taken: age(xmin).
	XidAge int64
	// Holder says who holds it: a session's pid, application name and
	// state, a replication slot's name, or a prepared transaction's gid.
	// Empty when nothing does.
	Holder string
	// At is when it was read.
	At time.Time
}

// horizonSQL reads the oldest of: the snapshots of this database's sessions
// and of WAL senders (a standby's hot_standby_feedback), the xmin of
// replication slots, and this database's prepared transactions. A role
// without pg_read_all_stats sees other roles' sessions without their
// backend_xmin, and misses them.
const horizonSQL = `
SELECT who, coalesce(seconds, 0), xid_age FROM (
    SELECT format('session pid %s (%s, %s)', pid, coalesce(nullif(application_name, ''), backend_type), state) AS who,
           extract(epoch FROM now() - coalesce(xact_start, backend_start))::float8 AS seconds,
           age(backend_xmin)::bigint AS xid_age
    FROM pg_stat_activity
    WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
      AND (datname = current_database() OR backend_type = 'walsender')
    UNION ALL
    SELECT format('replication slot %s', slot_name), NULL, age(xmin)::bigint
    FROM pg_replication_slots WHERE xmin IS NOT NULL
    UNION ALL
    SELECT format('prepared transaction %s', gid), extract(epoch FROM now() - prepared)::float8, age(transaction)::bigint
    FROM pg_prepared_xacts WHERE database = current_database()
) h
ORDER BY xid_age DESC
LIMIT 1`

// CheckHorizon reads the database's oldest snapshot now, keeps it for
// LastHorizon, and logs a warning when it is older than Config.HorizonWarn
// or HorizonWarnXids. Run calls it after each pass.
func (s *Sweeper) CheckHorizon(ctx context.Context) (Horizon, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	h := Horizon{At: time.Now()}
	err := s.cfg.Pool.QueryRow(ctx, horizonSQL).Scan(&h.Holder, &h.Seconds, &h.XidAge)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return h, fmt.Errorf("read the oldest snapshot: %w", err)
	}
	s.horizon.Store(&h)
	age := time.Duration(h.Seconds * float64(time.Second))
	if h.Holder != "" && (age >= s.cfg.HorizonWarn || h.XidAge >= HorizonWarnXids) {
		s.logger.Warn("the database's oldest snapshot is old: vacuum cannot remove the row versions jobs leave behind, "+
			"and the table and its indexes grow until it ends (see docs/operations.md, 'A snapshot that holds back vacuum')",
			zap.String("holder", h.Holder), zap.Duration("age", age.Round(time.Second)), zap.Int64("xid_age", h.XidAge))
	}
	return h, nil
}

// LastHorizon is what the last CheckHorizon read; ok is false before the
// first.
func (s *Sweeper) LastHorizon() (h Horizon, ok bool) {
	p := s.horizon.Load()
	if p == nil {
		return Horizon{}, false
	}
	return *p, true
}

package sweeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"
)

// DefaultOldestXminWarn is Config.OldestXminWarn's default.
const DefaultOldestXminWarn = 5 * time.Minute

// horizonSQL finds what holds back the database's xmin horizon, the oldest
// row version vacuum must keep: the session or the replication slot whose
// xmin is the oldest. A session counts when it is in this database and has
// a snapshot (backend_xmin) or a transaction id (backend_xid); when it is a
// walsender carrying a standby's hot_standby_feedback; and in any other
// database when it has a transaction id, which every snapshot taken in this
// one keeps as running. A replication slot counts when it is physical or of
// this database. The age is given in transaction ids, and for a session in
// seconds since its transaction began, read on the clock of this statement
// (clock_timestamp(), not now(), the start of this transaction, which can
// be later than another session's xact_start); both are at least 0. A
// session's seconds are NULL when the role may not read its xact_start
// (pg_read_all_stats), and a slot has none. The statement's own session is
// left out, and autovacuum's: its vacuums hold back no horizon, and its
// analyzes are short and not the operator's.
const horizonSQL = `
WITH a AS (
    SELECT *, datname = current_database() OR backend_type = 'walsender' AS here
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'
), h AS (
    SELECT CASE WHEN backend_type = 'walsender' THEN 'walsender' ELSE 'session' END AS holder,
           pid::text AS name, datname AS db, application_name AS app, state,
           greatest(0, extract(epoch FROM clock_timestamp() - xact_start))::float8 AS seconds,
           greatest(0, age(backend_xid), CASE WHEN here THEN age(backend_xmin) END)::bigint AS xids,
           CASE WHEN NOT here OR coalesce(age(backend_xid), -1) >= coalesce(age(backend_xmin), -1)
                THEN backend_xid ELSE backend_xmin END::text AS xmin
    FROM a
    WHERE backend_xid IS NOT NULL OR (here AND backend_xmin IS NOT NULL)
    UNION ALL
    SELECT 'replication slot', slot_name::text, database, NULL, NULL, NULL::float8,
           greatest(0, age(xmin))::bigint, xmin::text
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL AND (database IS NULL OR database = current_database())
)
SELECT holder, name, db, app, state, seconds, xids, xmin FROM h ORDER BY xids DESC, seconds DESC NULLS LAST LIMIT 1`

// Horizon is what holds back the database's xmin horizon, as the last
// look found it.
type Horizon struct {
	// Known is false until a look succeeded, and after one failed.
	Known bool
	// Age is how long the horizon has been held: for a session whose
	// transaction start the role may read, since that start; else (a
	// replication slot, a standby's feedback, another role's session
	// without pg_read_all_stats) since the sweeper first saw the same xmin
	// as the oldest, which is a lower bound. 0 when nothing holds one.
	Age time.Duration
	// Xids is the age of the oldest xmin in transaction ids (age(xmin)).
	Xids int64
	// Holder is "session", "walsender" or "replication slot", Name its pid
	// or slot name, and Database its database (a session's may be
	// another: its transaction id holds back this one's horizon too);
	// empty when nothing holds an xmin.
	Holder, Name, Database string
	// App and State are a session's application_name and state.
	App, State string
}

// horizon watches the xmin horizon: the last look, and when the current
// oldest xmin was first seen.
type horizon struct {
	mu        sync.Mutex
	last      Horizon
	xmin      string
	firstSeen time.Time
	warned    bool
}

// OldestXmin is what the last look found holding back the horizon.
func (s *Sweeper) OldestXmin() Horizon {
	s.horizon.mu.Lock()
	defer s.horizon.mu.Unlock()
	return s.horizon.last
}

// LookAtHorizon reads what holds the horizon back now, as each pass of Run
// does in its first transaction; it warns once each time the age rises past OldestXminWarn,
// and says so once it falls back.
func (s *Sweeper) LookAtHorizon(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	_ = s.noteHorizon(s.cfg.Pool.QueryRow(ctx, horizonSQL))
}

// noteHorizon reads horizonSQL's row and warns as LookAtHorizon says. It
// returns the error of a look that failed.
func (s *Sweeper) noteHorizon(row pgx.Row) error {
	var (
		holder, name, db, app, state, xmin pgtype.Text
		seconds                            pgtype.Float8
		xids                               pgtype.Int8
	)
	err := row.Scan(&holder, &name, &db, &app, &state, &seconds, &xids, &xmin)
	now := time.Now()
	h := &s.horizon
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		h.last, h.xmin = Horizon{Known: true}, ""
	case err != nil:
		h.last = Horizon{}
		s.logger.Debug("could not read the oldest xmin", zap.Error(err))
		return err
	default:
		if xmin.String != h.xmin {
			h.xmin, h.firstSeen = xmin.String, now
		}
		age := now.Sub(h.firstSeen)
		if seconds.Valid {
			age = time.Duration(seconds.Float64 * float64(time.Second))
		}
		h.last = Horizon{Known: true, Age: max(age, 0), Xids: xids.Int64, Holder: holder.String, Name: name.String, Database: db.String, App: app.String, State: state.String}
	}
	l := h.last
	switch {
	case l.Age >= s.cfg.OldestXminWarn && !h.warned:
		h.warned = true
		s.logger.Warn("the database's oldest snapshot holds back vacuum: claims slow down with every job run while it lasts",
			zap.String("holder", l.Holder), zap.String("name", l.Name), zap.String("database", l.Database), zap.String("application_name", l.App), zap.String("state", l.State),
			zap.Duration("age", l.Age.Round(time.Second)), zap.Int64("age_xids", l.Xids),
			zap.String("see", "docs/operations.md, \"A transaction that holds back vacuum\""))
	case l.Age < s.cfg.OldestXminWarn && h.warned:
		h.warned = false
		s.logger.Info("the database's oldest snapshot is younger than the warning's threshold again",
			zap.Duration("threshold", s.cfg.OldestXminWarn), zap.String("holder", l.Holder), zap.Duration("age", l.Age.Round(time.Second)))
	}
	return nil
}

// String says what holds the horizon, for tests and logs.
func (h Horizon) String() string {
	if !h.Known {
		return "unknown"
	}
	if h.Holder == "" {
		return "nothing"
	}
	return fmt.Sprintf("%s %s in %s (%s, %s): %s, %d xids", h.Holder, h.Name, h.Database, h.App, h.State, h.Age, h.Xids)
}

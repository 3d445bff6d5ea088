package atworker

import (
	"cmp"
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// SettleLooks is how many intervals a Settler with no bridge waits between
// looks for one: a switch made while it runs is settled from then on. It
// is long (5 minutes at a 30s interval), so that an idle worker of a
// database that never switched stays idle.
const SettleLooks = 10

// SettlerConfig configures a Settler.
type SettlerConfig struct {
	// DB runs every statement. Required.
	DB DB
	// Schema is pgdispatch's schema. Required.
	Schema string
	// Interval is how often the bridges' finished jobs are written into
	// their rows: it must be shorter than the sweeper's retention, so the
	// worker passes its sweep interval. Required.
	Interval time.Duration
	// StatementTimeout bounds each statement. Required.
	StatementTimeout time.Duration
	// Logger receives the settler's logs. Default: no logging.
	Logger *zap.Logger
}

// Settler writes the outcomes of the bridges' finished jobs into their
// rows (Settle) every Interval, before the sweeper can purge them; while
// there is no bridge, it looks for one every SettleLooks intervals. Every
// pgdispatch.Worker runs one.
type Settler struct {
	cfg    SettlerConfig
	logger *zap.Logger
}

// NewSettler checks cfg and returns a Settler.
func NewSettler(cfg SettlerConfig) (*Settler, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("atworker: DB is required")
	case cfg.Schema == "":
		return nil, errors.New("atworker: Schema is required")
	case cfg.Interval <= 0, cfg.StatementTimeout <= 0:
		return nil, errors.New("atworker: Interval and StatementTimeout must be more than 0")
	}
	return &Settler{cfg: cfg, logger: cmp.Or(cfg.Logger, zap.NewNop()).Named("at_worker")}, nil
}

// Run settles until ctx ends, and then returns nil. A failed pass is
// logged and tried again after Interval.
func (s *Settler) Run(ctx context.Context) error {
	for {
		wait := s.cfg.Interval * SettleLooks
		lookCtx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
		rels, err := bridges(lookCtx, s.cfg.DB, s.cfg.Schema)
		cancel()
		if err == nil && len(rels) > 0 {
			wait = s.cfg.Interval
			var n int64
			n, err = Settle(ctx, s.cfg.DB, s.cfg.Schema, s.cfg.StatementTimeout)
			if n > 0 {
				s.logger.Debug("finished jobs written into scheduled_tasks", zap.Int64("rows", n))
			}
		}
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("writing finished jobs into scheduled_tasks failed", zap.Error(err))
			wait = s.cfg.Interval
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

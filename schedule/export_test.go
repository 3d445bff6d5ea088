package schedule

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// SetAfterLock makes every pass of s that locks schedules call f with its
// transaction before it fires them.
func SetAfterLock(s *Scheduler, f func(ctx context.Context, tx pgx.Tx)) { s.afterLock = f }

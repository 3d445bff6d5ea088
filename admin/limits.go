package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// FlowLimit is a row of the flow_limits table: the limits of a key of a
// queue, or of every key of it (docs/operations.md, "Flow control").
type FlowLimit struct {
	Queue string `json:"queue"`
	// Key is the flow key; empty: every key of the queue. A row for an
	// exact key overrides the queue's row for every key, wholly.
	Key string `json:"key,omitempty"`
	// Concurrency is how many jobs of a key may run at once; 0: no limit.
	Concurrency int `json:"concurrency,omitempty"`
	// Strict makes a key's jobs start one at a time, in (priority, run_at,
	// id) order.
	Strict bool `json:"strict"`
	// Rate starts of a key at most in any window of length Per; 0: no limit.
	Rate int           `json:"rate,omitempty"`
	Per  time.Duration `json:"per,omitempty"`
	// UpdatedAt is when the row last changed; SetFlowLimit ignores it.
	UpdatedAt time.Time `json:"updated_at"`
}

// SetFlowLimit declares l (set_flow_limit() in SQL), replacing the limits
// declared before for its queue and key, and wakes the queue's workers.
func (a *Admin) SetFlowLimit(ctx context.Context, l FlowLimit) error {
	if l.Concurrency < 0 || l.Rate < 0 || l.Per < 0 {
		return fmt.Errorf("set flow limit of queue %q: the concurrency, rate and interval must be positive", l.Queue)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var per any
	if l.Per > 0 || l.Rate > 0 {
		per = l.Per.Seconds()
	}
	_, err := a.pool.Exec(ctx, a.sql(`SELECT {schema}.set_flow_limit($1, $2, $3, $4, $5, make_interval(secs => $6::float8))`),
		l.Queue, nilIfEmpty(l.Key), nilIfZeroInt(l.Concurrency), l.Strict, nilIfZeroInt(l.Rate), per)
	if err != nil {
		return fmt.Errorf("set flow limit of queue %q: %w", l.Queue, err)
	}
	return nil
}

// ClearFlowLimit removes the limits of key in queue (key empty: the row
// for every key of the queue; the exact keys' rows stay), and reports
// whether there were any (clear_flow_limit() in SQL).
func (a *Admin) ClearFlowLimit(ctx context.Context, queue, key string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var removed bool
	if err := a.pool.QueryRow(ctx, a.sql(`SELECT {schema}.clear_flow_limit($1, $2)`), queue, nilIfEmpty(key)).Scan(&removed); err != nil {
		return false, fmt.Errorf("clear flow limit of queue %q: %w", queue, err)
	}
	return removed, nil
}

// FlowLimits lists the declared limits by queue and key, the row for
// every key of a queue first; of queue alone when it is not empty.
func (a *Admin) FlowLimits(ctx context.Context, queue string) ([]FlowLimit, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`
SELECT queue, coalesce(key, ''), coalesce(concurrency, 0), strict, coalesce(rate, 0),
       coalesce(extract(epoch FROM per), 0)::float8, updated_at
FROM {schema}.flow_limits
WHERE $1::text IS NULL OR queue = $1
ORDER BY queue, key NULLS FIRST`), nilIfEmpty(queue))
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (FlowLimit, error) {
		var (
			l   FlowLimit
			per float64
		)
		err := row.Scan(&l.Queue, &l.Key, &l.Concurrency, &l.Strict, &l.Rate, &per, &l.UpdatedAt)
		l.Per = time.Duration(per * float64(time.Second))
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("list flow limits: %w", err)
	}
	return out, nil
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nilIfZeroInt(n int) any {
	if n == 0 {
		return nil
	}
	return n
}

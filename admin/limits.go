package admin

import (
	"context"
	"errors"
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
	Per  time.Duration `json:"-"`
	// PerSeconds is Per in seconds, as FlowLimits reports it in JSON.
	PerSeconds float64 `json:"per_seconds,omitempty"`
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
		l.Per, l.PerSeconds = time.Duration(per*float64(time.Second)), per
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

// flowWaitSQL reads what holds back a pending job of key $2 in queue $1
// whose place in its key's order is ($3, $4, $5) = (priority, run_at, id):
// the limit that applies to the key (its own row, else the queue's), the
// key's running jobs, the job ahead of it in strict order (a running job,
// the key's head while it is pending again, or a pending job before it),
// and the key's starts within its rate window. No row: no limit applies.
const flowWaitSQL = `
WITH l AS (
    SELECT l.concurrency, l.strict, l.rate, l.per FROM {schema}.flow_limits l
    WHERE l.queue = $1 AND (l.key = $2 OR l.key IS NULL)
      AND EXISTS (SELECT FROM {schema}.queues q WHERE q.name = $1 AND q.limited)
    ORDER BY l.key NULLS LAST
    LIMIT 1
)
SELECT coalesce(l.concurrency, 0), l.strict, coalesce(l.rate, 0), coalesce(extract(epoch FROM l.per), 0)::float8,
       (SELECT count(*) FROM {jobs} j WHERE j.queue = $1 AND j.flow_key = $2 AND j.status = 'running'),
       (SELECT j.id FROM {jobs} j
        WHERE j.queue = $1 AND j.flow_key = $2 AND j.id <> $5
          AND (j.status = 'running'
               OR (j.status = 'pending' AND (j.id = k.head OR (j.priority, j.run_at, j.id) < ($3::smallint, $4::timestamptz, $5::bigint))))
        ORDER BY j.status = 'running' DESC, coalesce(j.id = k.head, false) DESC, j.priority, j.run_at, j.id
        LIMIT 1),
       (SELECT count(*) FROM unnest(k.starts) s WHERE s > now() - l.per)
FROM l LEFT JOIN {schema}.flow_keys k ON k.queue = $1 AND k.key = $2`

// FlowWait says why j, a pending and due job with a flow key in a limited
// queue, is not started: its key is at its concurrency limit, runs in
// strict order with another job ahead of it, or is at its rate. It returns
// "" for any other job, and for one no limit holds back now (the key may
// be waiting for its turn among the queue's keys).
func (a *Admin) FlowWait(ctx context.Context, j Job) (string, error) {
	if j.Status != "pending" || j.FlowKey == nil || j.RunAt.After(time.Now()) {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var (
		concurrency, rate int
		strict            bool
		per               float64
		running, recent   int64
		ahead             *int64
	)
	err := a.pool.QueryRow(ctx, a.sql(flowWaitSQL), j.Queue, *j.FlowKey, j.Priority, j.RunAt, j.ID).
		Scan(&concurrency, &strict, &rate, &per, &running, &ahead, &recent)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("job %d: why it waits: %w", j.ID, err)
	}
	key := *j.FlowKey
	switch {
	case strict && ahead != nil:
		return fmt.Sprintf("key %s runs in strict order; job %d is ahead of it", key, *ahead), nil
	case concurrency > 0 && running >= int64(concurrency):
		return fmt.Sprintf("key %s at its concurrency limit of %d (%d running)", key, concurrency, running), nil
	case rate > 0 && recent >= int64(rate):
		return fmt.Sprintf("key %s at its rate of %d per %s", key, rate, time.Duration(per*float64(time.Second))), nil
	}
	return "", nil
}

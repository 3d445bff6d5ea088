package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/claimer"
)

// latency: an idle worker; jobs inserted one per transaction from another
// connection, Gap apart; commit-return to executor start, and where the
// time went (hops.go).
func (b *bench) latency(ctx context.Context) ([]*Result, error) {
	p := newProbe(0)
	p.hops = newHops()
	b.lonely = p
	schema, _, cleanup, err := b.workerWith(ctx, p, nil)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind) VALUES ('noop') RETURNING id"
	ahead := ""
	if b.opts.Ahead > 0 {
		// Once the worker listens: a worker that runs meets them.
		if _, err := b.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+
			" (kind, run_at) SELECT 'noop', now() + interval '1 day' + g * interval '1 millisecond' FROM generate_series(1, $1) g", b.opts.Ahead); err != nil {
			return nil, err
		}
		ahead = fmt.Sprintf(", %d jobs scheduled a day ahead in the queue", b.opts.Ahead)
	}
	sentAt, committed, err := b.lone(ctx, insert)
	if err != nil {
		return nil, err
	}
	lat, err := waitLatencies(ctx, p, committed, 30*time.Second)
	if err != nil {
		return nil, err
	}
	jobs := make(map[int64]marks, len(committed))
	p.mu.Lock()
	for id, c := range committed {
		m := p.hops.marks(id, sentAt[id])
		m[markCommit], m[markStarted] = c, p.started[id]
		jobs[id] = m
	}
	p.mu.Unlock()
	if err := b.recordLatencies("latency", 1, p, committed, jobs); err != nil {
		return nil, err
	}
	r := &Result{Scenario: "latency", Conditions: fmt.Sprintf("%d jobs, one per transaction, %s apart, idle worker, CONCURRENCY=%d, worker's synchronous_commit=%s%s",
		b.opts.Jobs, b.opts.Gap, b.base.Concurrency, b.pool.Config().ConnConfig.RuntimeParams["synchronous_commit"], ahead)}
	addPercentiles(r, "latency_ms", lat)
	addBreakdown(r, slices.Collect(maps.Values(jobs)))
	return []*Result{r}, nil
}

// lone inserts Jobs jobs with insert (which returns the id), one per
// transaction, Gap apart, on a connection of its own, and returns when
// each insert was sent and when its commit returned.
func (b *bench) lone(ctx context.Context, insert string, args ...any) (sentAt, committed map[int64]time.Time, err error) {
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	sentAt, committed = make(map[int64]time.Time, b.opts.Jobs), make(map[int64]time.Time, b.opts.Jobs)
	var slept int64 // the claimer's sleeps before the last job
	for range b.opts.Jobs {
		if b.opts.asleepFirst {
			if slept, err = b.asleepSince(ctx, slept); err != nil {
				return nil, nil, err
			}
		}
		var id int64
		sent := time.Now()
		if err := conn.QueryRow(ctx, insert, args...).Scan(&id); err != nil {
			return nil, nil, err
		}
		committed[id], sentAt[id] = time.Now(), sent
		time.Sleep(b.opts.Gap) // the scenario's pacing, not synchronisation
	}
	return sentAt, committed, nil
}

// asleepSince waits until the lone jobs' claimer has gone to sleep more
// than slept times, and returns how many times it has.
func (b *bench) asleepSince(ctx context.Context, slept int64) (int64, error) {
	return sleptMore(ctx, b.lonely.worker.Claimer("default"), slept)
}

// sleptMore waits until c has gone to sleep more than slept times, and
// returns how many times it has.
func sleptMore(ctx context.Context, c *claimer.Claimer, slept int64) (int64, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		if n := c.Stats().Sleeps; n > slept {
			return n, nil
		}
		if time.Now().After(deadline) {
			return 0, errors.New("the lone jobs' claimer did not go to sleep within a minute")
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// waitLatencies waits until every committed job started and returns the
// commit-to-start delays.
func waitLatencies(ctx context.Context, p *probe, committed map[int64]time.Time, timeout time.Duration) ([]time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		var lat []time.Duration
		missing := 0
		for id, c := range committed {
			s, ok := p.started[id]
			if !ok {
				missing++
				continue
			}
			lat = append(lat, s.Sub(c))
		}
		p.mu.Unlock()
		if missing == 0 {
			return lat, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d jobs never started", missing, len(committed))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// addPercentiles adds the p50, p90, p99 and max of ds as name's
// (name_p50_ms from name_ms).
func addPercentiles(r *Result, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	base := strings.TrimSuffix(name, "_ms")
	addQuantiles(r, base, ds)
	r.set(base+"_max_ms", ms(ds[len(ds)-1]))
}

// addQuantiles sorts ds, not empty, and adds its p50, p90 and p99 as
// base's.
func addQuantiles(r *Result, base string, ds []time.Duration) {
	slices.Sort(ds)
	pick := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	r.set(base+"_p50_ms", ms(pick(0.50)))
	r.set(base+"_p90_ms", ms(pick(0.90)))
	r.set(base+"_p99_ms", ms(pick(0.99)))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// latency: an idle worker; jobs inserted one per transaction from another
// connection, spaced apart; commit-return to executor start.
func (b *bench) latency(ctx context.Context) ([]*Result, error) {
	schema, p, cleanup, err := b.worker(ctx, 0, nil)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind) VALUES ('noop') RETURNING id"
	committed := make(map[int64]time.Time, b.opts.Jobs)
	for range b.opts.Jobs {
		var id int64
		if err := conn.QueryRow(ctx, insert).Scan(&id); err != nil {
			return nil, err
		}
		committed[id] = time.Now()
		time.Sleep(b.opts.Spacing) // the scenario's pacing, not synchronisation
	}
	lat, err := waitLatencies(ctx, p, committed, 30*time.Second)
	if err != nil {
		return nil, err
	}
	if err := b.recordLatencies("latency", 1, p, committed); err != nil {
		return nil, err
	}
	r := &Result{Scenario: "latency", Conditions: fmt.Sprintf("%d jobs, one per transaction, %s apart, idle worker, CONCURRENCY=%d, worker's synchronous_commit=%s",
		b.opts.Jobs, b.opts.Spacing, b.base.Concurrency, b.pool.Config().ConnConfig.RuntimeParams["synchronous_commit"])}
	addPercentiles(r, "latency_ms", lat)
	return []*Result{r}, nil
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

func addPercentiles(r *Result, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	pick := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	base := strings.TrimSuffix(name, "_ms")
	r.set(base+"_p50_ms", ms(pick(0.50)))
	r.set(base+"_p90_ms", ms(pick(0.90)))
	r.set(base+"_p99_ms", ms(pick(0.99)))
	r.set(base+"_max_ms", ms(ds[len(ds)-1]))
}

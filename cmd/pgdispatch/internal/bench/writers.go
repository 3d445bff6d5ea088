package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
)

// roundTripEvery is how often the sustained scenario's extra connection
// sends a bare SELECT 1 while the writers run.
const roundTripEvery = 2 * time.Millisecond

// writerLoad runs k connections inserting one job per transaction for d and
// returns the commit times by id. If withRoundTrips, one more connection
// sends SELECT 1 every roundTripEvery during the same window and the round
// trips' durations are returned: what one round trip to the server costs on
// the machine the writers load, the least a claim can take.
func (b *bench) writerLoad(ctx context.Context, schema string, k int, d time.Duration, withRoundTrips bool) (map[int64]time.Time, []time.Duration, error) {
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind) VALUES ('noop') RETURNING id"
	// Connect and prepare first, then start every writer at once: the
	// writers' time is spent inserting, not connecting and warming caches,
	// which a loaded machine makes slower in one turn than in the next.
	conns := make([]*pgx.Conn, k)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				_ = conn.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	for i := range conns {
		conn, err := b.connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		conns[i] = conn
		if _, err := conn.Prepare(ctx, "insert", insert); err != nil {
			return nil, nil, err
		}
	}
	var pinger *pgx.Conn
	if withRoundTrips {
		var err error
		if pinger, err = b.connect(ctx); err != nil {
			return nil, nil, err
		}
		defer pinger.Close(context.WithoutCancel(ctx)) //nolint:errcheck // nothing to do about it
	}
	var (
		mu        sync.Mutex
		committed = map[int64]time.Time{}
		wg        sync.WaitGroup
		firstErr  error
	)
	start := make(chan struct{})
	var end time.Time // set before start closes
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			local := map[int64]time.Time{}
			for time.Now().Before(end) && ctx.Err() == nil {
				var id int64
				if err := conn.QueryRow(ctx, "insert").Scan(&id); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				local[id] = time.Now()
			}
			mu.Lock()
			for id, t := range local {
				committed[id] = t
			}
			mu.Unlock()
		}()
	}
	var roundTrips []time.Duration
	if pinger != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var err error
			roundTrips, err = timeRoundTrips(ctx, pinger, end)
			mu.Lock()
			firstErr = cmpErr(firstErr, err)
			mu.Unlock()
		}()
	}
	end = time.Now().Add(d)
	close(start)
	wg.Wait()
	return committed, roundTrips, firstErr
}

// timeRoundTrips sends SELECT 1 on conn every roundTripEvery until end and
// returns how long each took.
func timeRoundTrips(ctx context.Context, conn *pgx.Conn, end time.Time) ([]time.Duration, error) {
	tick := time.NewTicker(roundTripEvery)
	defer tick.Stop()
	var out []time.Duration
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-tick.C:
		}
		sent := time.Now()
		if err := conn.PgConn().Exec(ctx, "SELECT 1").Close(); err != nil {
			return out, err
		}
		out = append(out, time.Since(sent))
	}
	return out, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// sustained: K writers at full speed while a worker runs.
func (b *bench) sustained(ctx context.Context) ([]*Result, error) {
	var out []*Result
	for _, k := range b.opts.Writers {
		schema, p, cleanup, err := b.worker(ctx, 0, nil)
		if err != nil {
			return nil, err
		}
		startCount := p.count.Load()
		heard := b.notifications(p)
		committed, roundTrips, err := b.writerLoad(ctx, schema, k, b.opts.Duration, true)
		completedInWindow := p.count.Load() - startCount
		heard = b.notifications(p) - heard
		if err != nil {
			cleanup()
			return nil, err
		}
		lat, err := waitLatencies(ctx, p, committed, 60*time.Second)
		cleanup()
		if err != nil {
			return nil, err
		}
		if err := b.recordLatencies("sustained", k, p, committed, nil); err != nil {
			return nil, err
		}
		r := &Result{Scenario: "sustained", Conditions: fmt.Sprintf("%d writers for %s, one job per transaction, CONCURRENCY=%d", k, b.opts.Duration, b.base.Concurrency)}
		r.set("inserts_per_s", float64(len(committed))/b.opts.Duration.Seconds())
		r.set("completed_per_s", float64(completedInWindow)/b.opts.Duration.Seconds())
		r.set("notified_share", float64(heard)/float64(max(len(committed), 1)))
		addPercentiles(r, "latency_ms", lat)
		addPercentiles(r, "round_trip_ms", roundTrips)
		out = append(out, r)
	}
	return out, nil
}

// writers: the same K writers with the NOTIFY triggers enabled and disabled,
// with a worker running; the ratio is the writers' cost of the trigger. So
// that the worker does the same work in both runs, the worker of the run
// without triggers never sleeps: it polls its queue every few milliseconds,
// which is what finds jobs when nothing notifies. Each side runs four
// times, for a quarter of the duration, in the order with, without, without,
// with, then without, with, with, without, so that a drift in the machine's
// speed weighs on both alike.
func (b *bench) writers(ctx context.Context) ([]*Result, error) {
	var out []*Result
	turns := []bool{true, false, false, true, false, true, true, false}
	turn := b.opts.Duration / time.Duration(len(turns)/2)
	for _, k := range b.opts.Writers {
		r := &Result{Scenario: "writers", Conditions: fmt.Sprintf("%d writers, %s with the trigger and %s without (the worker then claims every 1 ms), in %d turns each",
			k, b.opts.Duration, b.opts.Duration, len(turns)/2)}
		inserts := map[bool]int{}
		var heardAll int64
		for _, trigger := range turns {
			// Without the trigger, the worker finds the jobs by its tick.
			tune := func(c *pgdispatch.Config) { c.PollInterval = time.Millisecond }
			if trigger {
				tune = nil
			}
			schema, p, cleanup, err := b.worker(ctx, 0, tune)
			if err != nil {
				return nil, err
			}
			if !trigger {
				jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
				if _, err := b.pool.Exec(ctx, "ALTER TABLE "+jobs+" DISABLE TRIGGER jobs_notify_insert"); err != nil {
					cleanup()
					return nil, err
				}
			}
			heard := b.notifications(p)
			committed, _, err := b.writerLoad(ctx, schema, k, turn, false)
			heard = b.notifications(p) - heard
			usage := b.queueUsage(ctx)
			cleanup()
			if err != nil {
				return nil, err
			}
			inserts[trigger] += len(committed)
			if trigger {
				heardAll += heard
				r.set("notify_queue_usage", max(usage, r.Figures["notify_queue_usage"]))
			}
		}
		side := b.opts.Duration.Seconds()
		with, without := float64(inserts[true])/side, float64(inserts[false])/side
		r.set("notified_share", float64(heardAll)/float64(max(inserts[true], 1)))
		r.set("inserts_per_s_trigger", with)
		r.set("inserts_per_s_no_trigger", without)
		r.set("ratio", with/without)
		out = append(out, r)
	}
	return out, nil
}

// notifications is how many notifications the probe's worker has heard:
// with one worker, the writer transactions that sent NOTIFY.
func (b *bench) notifications(p *probe) int64 {
	if p.worker == nil {
		return 0
	}
	return p.worker.Listener().Notifications()
}

// queueUsage is pg_notification_queue_usage(): the share of the NOTIFY queue
// in use, which must stay near 0.
func (b *bench) queueUsage(ctx context.Context) float64 {
	var u float64
	_ = b.pool.QueryRow(ctx, "SELECT pg_notification_queue_usage()").Scan(&u)
	return u
}

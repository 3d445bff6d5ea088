package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// receiver is the http scenario's webhook receiver: a real HTTP server on
// loopback that records when each job's request arrived.
type receiver struct {
	mu      sync.Mutex
	arrived map[int64]time.Time
	count   atomic.Int64
	target  int64
	done    chan struct{}
	once    sync.Once
	url     string
	srv     *http.Server
}

func startReceiver(target int64) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{arrived: map[int64]time.Time{}, target: target, done: make(chan struct{}), url: "http://" + ln.Addr().String() + "/hook"}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	if id, err := strconv.ParseInt(req.Header.Get("Pgdispatch-Job-Id"), 10, 64); err == nil {
		r.mu.Lock()
		r.arrived[id] = now
		r.mu.Unlock()
	}
	if n := r.count.Add(1); r.target > 0 && n >= r.target {
		r.once.Do(func() { close(r.done) })
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) close() { _ = r.srv.Close() }

// httpWorker runs a worker whose http_callback executor may reach loopback,
// on a fresh schema.
func (b *bench) httpWorker(ctx context.Context, deleteDone bool) (string, func(), error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return "", nil, err
	}
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}})
	if err != nil {
		drop()
		return "", nil, err
	}
	stop, err := b.runWorker(ctx, schema, newCounter(0), func(c *pgdispatch.Config) {
		c.Registry.Register(httpcallback.Kind, exec)
		c.DeleteDone = deleteDone
	})
	if err != nil {
		drop()
		return "", nil, err
	}
	return schema, func() { stop(); drop() }, nil
}

// httpScenario: http_callback jobs to a receiver on loopback. Latency: an
// idle worker, jobs inserted one per transaction, spaced apart, from commit
// to the request's arrival. Drain: jobs inserted first, then delivered.
func (b *bench) httpScenario(ctx context.Context) ([]*benchResult, error) {
	rcv, err := startReceiver(0)
	if err != nil {
		return nil, err
	}
	defer rcv.close()
	payload, _ := json.Marshal(map[string]string{"url": rcv.url})

	schema, cleanup, err := b.httpWorker(ctx, false)
	if err != nil {
		return nil, err
	}
	conn, err := b.connect(ctx)
	if err != nil {
		cleanup()
		return nil, err
	}
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind, payload) VALUES ('http_callback', $1) RETURNING id"
	committed := make(map[int64]time.Time, b.opts.jobs)
	for range b.opts.jobs {
		var id int64
		if err := conn.QueryRow(ctx, insert, payload).Scan(&id); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			cleanup()
			return nil, err
		}
		committed[id] = time.Now()
		time.Sleep(b.opts.spacing) // the scenario's pacing, not synchronisation
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	lat, err := waitArrivals(ctx, rcv, committed, 30*time.Second)
	cleanup()
	if err != nil {
		return nil, err
	}
	latency := &benchResult{Scenario: "http", Conditions: fmt.Sprintf("%d http_callback jobs, one per transaction, %s apart, to a Go receiver on loopback, idle worker",
		b.opts.jobs, b.opts.spacing)}
	addPercentiles(latency, "commit_to_request_ms", lat)

	n := min(b.opts.drainJobs, 20000)
	drainRcv, err := startReceiver(int64(n))
	if err != nil {
		return nil, err
	}
	defer drainRcv.close()
	payload, _ = json.Marshal(map[string]string{"url": drainRcv.url})
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := b.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+" (kind, payload) SELECT 'http_callback', $2 FROM generate_series(1, $1)",
		n, payload); err != nil {
		return nil, err
	}
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	stop, err := b.runWorker(ctx, schema, newCounter(0), func(c *pgdispatch.Config) { c.Registry.Register(httpcallback.Kind, exec) })
	if err != nil {
		return nil, err
	}
	select {
	case <-drainRcv.done:
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
	took := time.Since(start)
	stop()
	drain := &benchResult{Scenario: "http_drain", Conditions: fmt.Sprintf("%d http_callback jobs to a Go receiver on loopback, one worker, CONCURRENCY=%d, done jobs kept (the HTTP client keeps at most %d connections to one host)",
		n, b.opts.concurrency, httpcallback.DefaultMaxConnsPerHost)}
	drain.set("jobs_per_s", float64(n)/took.Seconds())
	return []*benchResult{latency, drain}, nil
}

// waitArrivals waits until every committed job's request arrived and
// returns the commit-to-arrival delays.
func waitArrivals(ctx context.Context, r *receiver, committed map[int64]time.Time, timeout time.Duration) ([]time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		var lat []time.Duration
		for id, c := range committed {
			if at, ok := r.arrived[id]; ok {
				lat = append(lat, at.Sub(c))
			}
		}
		r.mu.Unlock()
		if len(lat) == len(committed) {
			return lat, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d requests never arrived", len(committed)-len(lat), len(committed))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// floorSQL is a procedure that drains the queue as a worker does, with the
// same row writes, inside the server: no network, no client, no executor.
// Each loop claims up to $1 due jobs (FOR UPDATE SKIP LOCKED, then running,
// the attempt counted, a lease) and commits without waiting for its WAL
// flush, then records them done and commits with it, as the claimer and the
// completer do. The statements mirror the claimer's (claimer/sql.go) in the
// rows and columns they write; the claimer's own also report the next
// run_at and skipped rows, and bound the payload bytes.
const floorSQL = `
CREATE PROCEDURE {schema}.bench_floor(batch int) LANGUAGE plpgsql AS $$
DECLARE
    claimed_ids bigint[];
    claimed_attempts int[];
BEGIN
    LOOP
        PERFORM set_config('synchronous_commit', 'off', true);
        WITH c AS (
            SELECT ctid FROM {jobs}
            WHERE status = 'pending' AND queue = 'default' AND run_at <= now()
            ORDER BY priority, run_at, id
            LIMIT batch
            FOR UPDATE SKIP LOCKED
        ), u AS (
            UPDATE {jobs} j
            SET status = 'running', attempts = least(j.attempts, 999999) + 1, max_attempts = coalesce(j.max_attempts, 5),
                locked_by = 'bench-floor', locked_until = now() + interval '30 seconds', updated_at = now()
            WHERE j.ctid = ANY(ARRAY(SELECT ctid FROM c))
            RETURNING j.id, j.attempts
        )
        SELECT array_agg(u.id ORDER BY u.id), array_agg(u.attempts ORDER BY u.id) INTO claimed_ids, claimed_attempts FROM u;
        EXIT WHEN claimed_ids IS NULL;
        COMMIT;
        UPDATE {jobs} j
        SET status = 'done', finished_at = now(), locked_by = NULL, locked_until = NULL, updated_at = now()
        FROM unnest(claimed_ids, claimed_attempts) AS v(id, attempt)
        WHERE j.id = v.id AND (j.status = 'running' AND j.locked_by = 'bench-floor' AND j.attempts = v.attempt) IS TRUE;
        COMMIT;
    END LOOP;
END $$`

// floor: the in-server floor of a drain with done jobs kept (floorSQL), as
// a share of which the drain's figure reads.
func (b *bench) floor(ctx context.Context) ([]*benchResult, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	if _, err := b.pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", b.opts.drainJobs); err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+jobs); err != nil {
		return nil, err
	}
	r := strings.NewReplacer("{schema}", pgx.Identifier{schema}.Sanitize(), "{jobs}", jobs)
	if _, err := b.pool.Exec(ctx, r.Replace(floorSQL)); err != nil {
		return nil, err
	}
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		return nil, err
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, "CALL "+pgx.Identifier{schema}.Sanitize()+".bench_floor($1)", b.opts.concurrency); err != nil {
		return nil, err
	}
	took := time.Since(start)
	res := &benchResult{Scenario: "floor", Conditions: fmt.Sprintf("%d jobs claimed %d at a time and recorded done (kept) by a PL/pgSQL procedure in the server",
		b.opts.drainJobs, b.opts.concurrency)}
	res.set("jobs_per_s", float64(b.opts.drainJobs)/took.Seconds())
	return []*benchResult{res}, nil
}

// statementCounter counts what a worker's pool sends: each batch and each
// statement outside a transaction is one transaction, and every statement
// is one statement.
type statementCounter struct {
	transactions, statements atomic.Int64
}

func (s *statementCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.statements.Add(1)
	if conn.PgConn().TxStatus() == 'I' {
		s.transactions.Add(1)
	}
	return ctx
}

func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.transactions.Add(1)
	return ctx
}

func (s *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	s.statements.Add(1)
}

func (s *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

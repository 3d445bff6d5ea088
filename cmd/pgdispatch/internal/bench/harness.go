package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// schemaPrefix begins the name of every schema a scenario creates.
const schemaPrefix = "pgdispatch_bench_"

// schema creates and migrates a fresh schema, dropped by the returned func.
func (b *bench) schema(ctx context.Context) (string, func(), error) {
	buf := make([]byte, 4)
	_, _ = rand.Read(buf)
	schema := schemaPrefix + hex.EncodeToString(buf)
	if _, _, err := migrations.Migrate(ctx, b.pool, migrations.Config{Schema: schema}); err != nil {
		return "", nil, err
	}
	return schema, func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = b.pool.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}, nil
}

// probe is the benchmark's executor: a no-op that records when each job
// started, on the same monotonic clock as the producers' commits. The drain's
// probe only counts: a map of 200,000 start times was 6.7 % of the process's
// CPU in a drain (pprof), work no worker of a real no-op job does.
type probe struct {
	mu      sync.Mutex
	started map[int64]time.Time
	count   atomic.Int64
	target  int64
	done    chan struct{}
	once    sync.Once
	worker  *pgdispatch.Worker // set once the worker runs
	hops    *hops              // when set, the worker's hooks record each job's marks
}

func newProbe(target int64) *probe {
	return &probe{started: map[int64]time.Time{}, target: target, done: make(chan struct{})}
}

// newCounter is a probe that records no start times.
func newCounter(target int64) *probe {
	return &probe{target: target, done: make(chan struct{})}
}

func (p *probe) Execute(_ context.Context, job *executors.Job) error {
	if p.started != nil {
		now := time.Now()
		p.mu.Lock()
		p.started[job.ID] = now
		p.mu.Unlock()
	}
	if n := p.count.Add(1); p.target > 0 && n >= p.target {
		p.once.Do(func() { close(p.done) })
	}
	return nil
}

// runWorker starts a worker on schema with the probe as noop and returns
// its stop function, which waits for the graceful shutdown.
func (b *bench) runWorker(ctx context.Context, schema string, p *probe, tune func(*pgdispatch.Config)) (stop func(), err error) {
	cfg := b.base
	cfg.Schema = schema
	cfg.Registry = executors.NewRegistry()
	cfg.Registry.Register(executors.KindNoop, p)
	cfg.Logger = zap.NewNop()
	listening := make(chan struct{}, 1)
	cfg.OnListen = func() {
		select {
		case listening <- struct{}{}:
		default:
		}
	}
	if tune != nil {
		tune(&cfg)
	}
	w, err := pgdispatch.NewWorker(cfg)
	if err != nil {
		return nil, err
	}
	p.worker = w
	wctx, cancel := context.WithCancel(ctx)
	if p.hops != nil {
		wctx = testhook.With(wctx, p.hops.hooks())
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	select {
	case <-listening:
	case err := <-done:
		cancel()
		return nil, err
	case <-time.After(30 * time.Second):
		cancel()
		return nil, errors.New("the worker's listener did not connect")
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(b.log, "bench: worker stopped with:", err)
		}
	}, nil
}

// connect opens a connection of its own, for a producer, configured as the
// pool's: the URL may hold pool settings (pool_max_conns), which pgx.Connect
// would send to the server as parameters it does not know.
func (b *bench) connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
}

// worker makes a schema and runs a worker on it with a probe; cleanup stops
// the worker and drops the schema.
func (b *bench) worker(ctx context.Context, target int64, tune func(*pgdispatch.Config)) (schema string, p *probe, cleanup func(), err error) {
	return b.workerWith(ctx, newProbe(target), tune)
}

// workerWith is worker with the probe p.
func (b *bench) workerWith(ctx context.Context, p *probe, tune func(*pgdispatch.Config)) (schema string, _ *probe, cleanup func(), err error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return "", nil, nil, err
	}
	stop, err := b.runWorker(ctx, schema, p, tune)
	if err != nil {
		drop()
		return "", nil, nil, err
	}
	return schema, p, func() { stop(); drop() }, nil
}

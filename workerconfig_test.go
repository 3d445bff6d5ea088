package pgdispatch_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// RetainDoneNone: done jobs are deleted at once.
func TestDeleteDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	cfg.RetainDone = pgdispatch.RetainDoneNone
	start(t, cfg)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.watch.Until(t, waitFor, "job deleted", func(m map[int64]pgtest.JobState) bool { return m[id].Deleted })
}

// A worker refuses a schema that was never migrated.
func TestRunNeedsSchema(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	w, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pgtest.Pool(t), Schema: schema, WorkerID: "w"})
	require.NoError(t, err)
	err = w.Run(context.Background())
	require.Error(t, err)
	require.ErrorIs(t, err, migrations.ErrSchemaMissing)
}

// A worker asked to stop before its schema check is done stops cleanly,
// even when the schema is missing: nothing had started. (A test that ends
// at once used to fail its cleanup with "check schema: context canceled".)
func TestRunStoppedBeforeItStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, schema := range []string{b.schema, pgtest.EmptySchemaName(t)} {
		w, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pgtest.Pool(t), Schema: schema, WorkerID: "w"})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.NoError(t, w.Run(ctx), schema)
	}
}

// Three busy queues on a pool of two connections: the claims, outcomes,
// heartbeats and sweeps of every queue take turns, and each backlog drains,
// once per job.
func TestBusyQueuesShareASmallPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfgPool, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfgPool.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfgPool)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	cfg := b.config(t, "small-pool")
	cfg.Pool = pool
	cfg.Queues = []pgdispatch.Queue{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	cfg.Concurrency = 20
	_, stop, _ := start(t, cfg)
	const n = 2000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+b.jobs+" (kind, queue) SELECT 'record', q FROM unnest(ARRAY['a', 'b', 'c']) q, generate_series(1, $1)", n)
	require.NoError(t, err)

	b.rec.waitStarts(t, 3*n)
	stop()
	b.rec.requireEachOnce(t, 3*n)
	var done int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+b.jobs+" WHERE status = 'done' AND attempts = 1").Scan(&done))
	require.Equal(t, 3*n, done)
}

// The default WorkerID is the hostname, the process id and a random
// suffix: two workers on one host, or in one process, are told apart in
// locked_by and the logs, and an operator still reads where each runs.
func TestDefaultWorkerIDIsUnique(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	require.NoError(t, err)
	form := regexp.MustCompile(`^` + regexp.QuoteMeta(host) + `-` + strconv.Itoa(os.Getpid()) + `-[0-9a-f]{6}$`)
	ids := map[string]bool{}
	for range 2 {
		w, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pgtest.Pool(t), Schema: pgtest.EmptySchemaName(t)})
		require.NoError(t, err)
		require.Regexp(t, form, w.ID())
		ids[w.ID()] = true
	}
	require.Len(t, ids, 2, "two workers of one process have IDs of their own")
}

// NewWorker refuses a queue the jobs table could not hold, or listed
// twice, and says which.
func TestNewWorkerChecksQueues(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	for _, tc := range []struct {
		queues []pgdispatch.Queue
		want   string
	}{
		{[]pgdispatch.Queue{{Name: ""}}, "a queue has no name"},
		{[]pgdispatch.Queue{{Name: strings.Repeat("q", migrations.NameLimit+1)}}, "at most 128 characters"},
		{[]pgdispatch.Queue{{Name: "a"}, {Name: "a"}}, `queue "a" is listed twice`},
		{[]pgdispatch.Queue{{Name: "a", Concurrency: -1}}, `the concurrency of queue "a" must not be negative`},
	} {
		cfg := b.config(t, "w")
		cfg.Queues = tc.queues
		_, err := pgdispatch.NewWorker(cfg)
		require.ErrorContains(t, err, tc.want)
	}
	cfg := b.config(t, "w")
	cfg.Queues = []pgdispatch.Queue{{Name: strings.Repeat("q", migrations.NameLimit)}}
	_, err := pgdispatch.NewWorker(cfg)
	require.NoError(t, err)
}

// ParseQueues reads names and concurrencies, and refuses what NewWorker
// would, saying what.
func TestParseQueues(t *testing.T) {
	t.Parallel()
	qs, err := pgdispatch.ParseQueues(" default, emails:4 ,")
	require.NoError(t, err)
	require.Equal(t, []pgdispatch.Queue{{Name: "default"}, {Name: "emails", Concurrency: 4}}, qs)
	for s, want := range map[string]string{
		" , ":      `" , " names no queue`,
		"a:0":      `the concurrency of queue "a" must be a whole number above 0`,
		"a:x":      `the concurrency of queue "a" must be a whole number above 0`,
		"a,b,a":    `queue "a" is listed twice`,
		":3":       "a queue has no name",
		"default,": "",
	} {
		_, err := pgdispatch.ParseQueues(s)
		if want == "" {
			require.NoError(t, err, s)
		} else {
			require.ErrorContains(t, err, want, s)
		}
	}
}

// The listener's connection gets a connect timeout and the name
// "pgdispatch-listener" unless its config sets them, and the config given
// stays as it was.
func TestListenConnDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		app, wantApp     string
		timeout, wantOut time.Duration
	}{
		{"", "pgdispatch-listener", 0, 10 * time.Second},
		{"pgdispatch", "pgdispatch-listener", 0, 10 * time.Second},
		{"mine", "mine", time.Second, time.Second},
	} {
		cc, err := pgdispatch.ListenConnConfigOf(pgtest.URL())
		require.NoError(t, err)
		cc.RuntimeParams["application_name"] = tc.app
		cc.ConnectTimeout = tc.timeout
		got := pgdispatch.ListenConnConfig(cc)
		require.Equal(t, tc.wantApp, got.RuntimeParams["application_name"])
		require.Equal(t, tc.wantOut, got.ConnectTimeout)
		require.Equal(t, tc.app, cc.RuntimeParams["application_name"], "the config given changed")
	}
	_, err := pgdispatch.ListenConnConfigOf("postgres://u:s3cret@h:bad/db")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
}

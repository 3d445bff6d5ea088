package sleepkey

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/migrations"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// The writers' triggers (migrations 003 and 007) and the claimer's sleep lock must
// name the same key, whatever the schema is called: writers notify a queue
// exactly while its key is held.
func TestSleepKeyMatchesTriggers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	schema := pgtest.EmptySchemaName(t) + ` it's \ odd`
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	_, _, err := migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	require.NoError(t, err)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()

	listener, sleeper, writer := pgtest.Conn(t), pgtest.Conn(t), pgtest.Conn(t)
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	insert := func(queue string, n int) {
		_, err := writer.Exec(ctx, "INSERT INTO "+jobs+" (kind, queue) SELECT 'noop', $1 FROM generate_series(1, $2)", queue, n)
		require.NoError(t, err)
	}

	_, err = sleeper.Exec(ctx, sleepLockSQL, migrations.SleepKey(schema), "q1")
	require.NoError(t, err)
	insert("q1", 500) // a worker of q1 sleeps: notify, once per transaction
	insert("q2", 1)   // nobody sleeps on q2
	_, err = writer.Exec(ctx, "UPDATE "+jobs+" SET run_at = now() + interval '1 hour' WHERE queue = 'q1'")
	require.NoError(t, err)
	_, err = sleeper.Exec(ctx, sleepFreeSQL, migrations.SleepKey(schema), "q1")
	require.NoError(t, err)
	insert("q1", 1) // nobody sleeps any more
	_, err = writer.Exec(ctx, "SELECT pg_notify($1, 'marker')", schema)
	require.NoError(t, err)

	var got []string
	for len(got) == 0 || got[len(got)-1] != "marker" {
		n, err := listener.WaitForNotification(ctx)
		require.NoError(t, err)
		got = append(got, n.Payload)
	}
	require.Equal(t, []string{"q1", "q1", "marker"}, got, "the insert and the update of q1 while its key was held")
}

// The sleep key's connection opens when the claimer starts, before its first
// sleep, so that going to sleep costs no new server process; it closes when
// the claimer stops.
func TestSleepConnectionOpensAtStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	cc := pool.Config().ConnConfig.Copy()
	app := "sleep-at-start-" + strings.ReplaceAll(t.Name(), "/", "-")
	cc.RuntimeParams["application_name"] = app
	s := New(cc, "some_schema", "default", 5*time.Second, zaptest.NewLogger(t))
	sessions := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app+"-sleep").Scan(&n))
		return n
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(runCtx) }()
	wait.For(t, 30*time.Second, "the sleep connection, opened while nobody asked for the key", func() bool { return sessions() == 1 })
	require.False(t, s.Holding())

	stop()
	<-done
	wait.For(t, 30*time.Second, "sessions() == 0", func() bool { return sessions() == 0 })
}

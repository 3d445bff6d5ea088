package pgcluster_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// helperEnv makes the test binary, run again, start a cluster, print its
// address and directory, and wait to be killed.
const helperEnv = "PGCLUSTER_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(c.URL(), c.Dir())
		// Wait for the test's SIGKILL. (Asking for a signal also keeps the
		// runtime from taking a process with nothing to do for deadlocked.)
		wait := make(chan os.Signal, 1)
		signal.Notify(wait, os.Interrupt)
		<-wait
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// A process that started a cluster is killed, with no chance to stop it:
// the reaper stops the server and removes its directory.
func TestKilledOwnersClusterIsReaped(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Wait()
		t.Fatalf("the helper printed no cluster: %v\n%s", err, stderr.String())
	}
	url, dir, ok := strings.Cut(strings.TrimSpace(line), " ")
	require.True(t, ok, line)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err, "the helper's cluster is up")
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	// The reaper outlives the helper and is nobody's child here: poll.
	wait.For(t, 30*time.Second, fmt.Sprintf("directory %s to be removed", dir), func() bool {
		_, statErr := os.Stat(dir)
		return errors.Is(statErr, os.ErrNotExist)
	})
	conn, err = pgx.Connect(ctx, url)
	if err == nil {
		_ = conn.Close(ctx)
	}
	require.Error(t, err, "the server at %s still runs", url)
}

// A cluster stopped as usual is gone, and so is its reaper.
func TestStopRemovesCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	require.NoError(t, c.Stop())
	_, err = os.Stat(c.Dir())
	require.ErrorIs(t, err, os.ErrNotExist)
	conn, err := pgx.Connect(ctx, c.URL())
	if err == nil {
		_ = conn.Close(ctx)
	}
	require.Error(t, err)
}

// A standby serves what its primary committed, refuses writes, and takes
// them once promoted after the primary crashed.
func TestStandbyPromotedAfterCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, primary.Stop()) }()
	standby, err := primary.StartStandby(ctx, pgcluster.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, standby.Stop()) }()

	conn, err := pgx.Connect(ctx, primary.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	wait.For(t, time.Minute, "the standby to become synchronous", func() bool {
		var sync bool
		err := conn.QueryRow(ctx, "SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'").Scan(&sync)
		return err == nil && sync
	})
	_, err = conn.Exec(ctx, "CREATE TABLE t AS SELECT 42 AS v")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	read, err := pgx.Connect(ctx, standby.URL())
	require.NoError(t, err)
	defer func() { _ = read.Close(ctx) }()
	var v int
	require.NoError(t, read.QueryRow(ctx, "SELECT v FROM t").Scan(&v), "a synchronous commit is on the standby")
	require.Equal(t, 42, v)
	_, err = read.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.ErrorContains(t, err, "read-only transaction")

	require.NoError(t, primary.Crash(ctx))
	_, err = pgx.Connect(ctx, primary.URL())
	require.Error(t, err, "the crashed primary still answers")
	require.NoError(t, standby.Promote(ctx))
	_, err = read.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err, "the promoted standby takes writes")
}

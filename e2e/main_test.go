// Package e2e runs the pgdispatch binary as real worker processes against a
// PostgreSQL cluster the tests own, the machine's RabbitMQ, and HTTP and
// SMTP receivers the tests control, and breaks things the way production
// does: workers killed, connections cut, the server restarted, a primary
// crashed and its synchronous standby promoted (on a pair of clusters of its
// own), the broker's connections closed, receivers failing and hanging, a
// schedule's holder frozen or killed in the middle of its pass, and garbage
// rows.
//
// Each scenario records every delivery on the receiving side, keyed by the
// producer's own key, and checks both directions at the end: every committed
// job delivered at least once, none left pending or running, duplicates
// within what was in flight at the faults, and every worker still serving.
// Each prints one summary line (go test -v ./e2e/ | grep summary).
//
// E2E_DURATION sets how long each stream runs (default 4s); make soak runs
// them longer. go test -short skips the suite, for a quick loop over the
// other packages; make test runs it.
package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
)

var (
	// binary is the pgdispatch binary under test, built once.
	binary string
	// cluster is the tests' own server: restarting it harms nothing else.
	cluster *pgcluster.Cluster
	// streamFor is how long each scenario's producers run. The faults are
	// spread over it, and strike lets work go on for one more interval
	// after the last, so each lands mid-stream whatever its length.
	streamFor = 4 * time.Second
)

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	flag.Parse()
	if testing.Short() {
		return m.Run(), nil // each test skips itself
	}
	if d := os.Getenv("E2E_DURATION"); d != "" {
		v, err := time.ParseDuration(d)
		if err != nil || v <= 0 {
			return 1, fmt.Errorf("invalid E2E_DURATION %q: want a duration such as 30s", d)
		}
		streamFor = v
	}
	dir, err := os.MkdirTemp("", "pgdispatch-e2e-")
	if err != nil {
		return 1, err
	}
	defer func() { _ = os.RemoveAll(dir) }()

	binary = filepath.Join(dir, "pgdispatch")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", binary, "github.com/pgdispatch/pgdispatch/cmd/pgdispatch")
	if out, err := build.CombinedOutput(); err != nil {
		return 1, fmt.Errorf("build the pgdispatch binary: %w\n%s", err, out)
	}

	// A cluster of the tests' own, whatever TEST_DATABASE_URL says: the
	// scenarios restart it and terminate its sessions.
	cluster, err = pgcluster.Start(ctx, pgcluster.Options{Settings: []string{"max_connections=200"}})
	if errors.Is(err, pgcluster.ErrNoServer) {
		return 1, fmt.Errorf("the end-to-end tests restart their own PostgreSQL and need its server binaries: %w", err)
	}
	if err != nil {
		return 1, err
	}
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stop the cluster:", err)
	}
	return code, nil
}

// skipShort skips the test under go test -short: the suite builds the binary,
// starts a cluster and runs each scenario for seconds.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("the end-to-end suite does not run under -short")
	}
}

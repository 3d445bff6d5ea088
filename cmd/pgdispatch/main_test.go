package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgdispatch-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "pgdispatch")
	// The race detector's runtime sleeps a second at the exit of a process
	// with more than one thread (atexit_sleep_ms, 1000 by default), which
	// hundreds of runs of the binary here would spend idle. A race is still
	// reported as it happens, and the exit waits for reports in progress:
	// only a race that a goroutine would hit after main returned goes
	// unseen, as it would in production, where the process ends at once.
	if err := os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")); err != nil {
		panic(err)
	}
	if out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build pgdispatch: %v\n%s", err, out)
		os.Exit(1)
	}
	pgtest.Main(cleanup{m, dir})
}

// cleanup removes the built binary after the tests (pgtest.Main exits).
type cleanup struct {
	m   *testing.M
	dir string
}

func (c cleanup) Run() int {
	defer func() { _ = os.RemoveAll(c.dir) }()
	return c.m.Run()
}

// proc is a pgdispatch subprocess.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
}

// syncBuffer collects a process's output and tells waiters about each write.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced on every write
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{written: make(chan struct{})} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.written)
	s.written = make(chan struct{})
	return s.b.Write(p)
}

// waitFor waits until the output contains substr.
func (s *syncBuffer) waitFor(t *testing.T, substr string, timeout time.Duration) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("the output so far:\n%s", s.String())
		}
	}()
	wait.On(t, timeout, fmt.Sprintf("the output to show %q", substr), func() (bool, <-chan struct{}) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return strings.Contains(s.b.String(), substr), s.written
	})
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// env is the environment of a subprocess: this one's, less every pgdispatch
// setting, plus the test's.
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if isSetting(name) {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

func isSetting(name string) bool {
	for _, g := range [][]settings.Setting{connSettings, workerSettings, executorSettings, serveSettings, atWorkerSettings} {
		for _, s := range g {
			if s.Env == name {
				return true
			}
		}
	}
	return strings.HasPrefix(name, "DB_")
}

func start(t *testing.T, environ []string, args ...string) *proc {
	t.Helper()
	return startWithInput(t, environ, nil, args...)
}

// startWithInput is start with stdin as the process's standard input.
func startWithInput(t *testing.T, environ []string, stdin io.Reader, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary, args...), stdout: newSyncBuffer(), stderr: newSyncBuffer(), done: make(chan struct{})}
	p.cmd.Env = environ
	p.cmd.Stdin = stdin
	p.cmd.Dir = t.TempDir() // no stray .env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s stderr:\n%s", args[0], p.stderr.String())
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("process did not exit within %s; stderr:\n%s", timeout, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

func dbEnv(schema string, extra ...string) []string {
	return env(append([]string{"DATABASE_URL=" + pgtest.URL(), "DB_SCHEMA=" + schema, "LOG_FORMAT=console", "LOG_LEVEL=debug"}, extra...)...)
}

func insert(t *testing.T, schema, sql string) int64 {
	t.Helper()
	var id int64
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		strings.ReplaceAll(sql, "{jobs}", pgx.Identifier{schema, "jobs"}.Sanitize())).Scan(&id))
	return id
}

func withParam(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}

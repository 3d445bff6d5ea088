package main

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// The README's first command, as a user runs it: no DATABASE_URL, so the demo
// starts and removes a throwaway PostgreSQL of its own. Its tour delivers
// webhooks and mail to its own receivers, the webhooks' signatures
// verified, retries a job and gives up on another. How long the tour took
// is logged; the minute waited for it only ends a stuck run.
// It runs before the package's parallel tests, as a user's demo runs alone.
func TestDemoOnThrowawayCluster(t *testing.T) {
	began := time.Now()
	p := start(t, env(), "demo")
	p.stdout.waitFor(t, "The tour took", time.Minute)
	t.Logf("the tour was over %s after the demo started", time.Since(began).Round(time.Millisecond))
	out := p.stdout.String()
	require.Contains(t, out, "starting a throwaway PostgreSQL")
	require.Contains(t, out, "after commit")
	require.Contains(t, out, "HTTP_ALLOW_NETWORKS=public,loopback")
	require.Regexp(t, `INSERT INTO "pgdispatch_demo"."jobs" \(kind, payload\)\nVALUES \('http_callback', '\{"url": "http://127\.0\.0\.1:\d+/orders"`, out, "the SQL is printed")
	for what, re := range map[string]string{
		"a webhook delivered, its signature verified": `(?m)^job \d+ +http_callback +attempt 1 .* done\n +receiver: POST /orders, signature verified, body \{.*"order_id":1042`,
		"an email received":                           `(?m)^job \d+ +email +attempt 1 .* done\n +receiver: mail "Order 1042 has shipped" from .* to alice@example\.com`,
		"a retry":                                     `(?m)^job (\d+) +http_callback +attempt 1 .* retry\n +receiver: POST /flaky, signature verified; answered 503`,
		"the retried job delivered":                   `(?m)^job \d+ +http_callback +attempt 2 .* after its run_at +done\n +receiver: POST /flaky, signatures? (by all 2 secrets it knows )?verified`,
		"a dead job":                                  `(?m)^job \d+ +email +attempt 1 .* dead\n +error: .*550`,
		"a scheduled job":                             `(?m)^job \d+ +email +attempt 1 .* after its run_at +done\n +receiver: mail "How was order 1042\?"`,
		"a webhook signed by both secrets":            `(?m)^job \d+ +http_callback +attempt 1 .* done\n +receiver: POST /orders, signatures by all 2 secrets it knows verified, body \{.*"order_id":1047`,
	} {
		require.Regexp(t, re, out, what)
	}
	require.Contains(t, out, "9 jobs, 8 delivered (1 after a retry), 1 dead")
	require.Contains(t, out, "rabbitmq  none: set RABBITMQ_URL")

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
	out = p.stdout.String()
	m := regexp.MustCompile(`(\d+) dispatches. Jobs by status: dead=1 done=8\n`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	n, _ := strconv.Atoi(m[1])
	require.Equal(t, 10, n, "an attempt per job, and two for the retried one")
	require.Contains(t, out, "Throwaway PostgreSQL stopped and removed.")
	require.NotContains(t, out+p.stderr.String(), "whsec_", "the signing secret is never printed")
}

// With DATABASE_URL the demo uses that server, and --count stops it after
// so many attempts.
func TestDemoCountOnDatabaseURL(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	p := start(t, dbEnv(schema), "demo", "--count", "4", "--interval", "50ms")
	require.Equal(t, 0, p.wait(t, 2*time.Minute), p.stderr.String())
	out := p.stdout.String()
	require.NotContains(t, out, "throwaway")
	require.Contains(t, out, `serves schema "`+schema+`"`)
	require.Contains(t, out, "after commit")
	m := regexp.MustCompile(`(\d+) dispatches`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	n, _ := strconv.Atoi(m[1])
	require.GreaterOrEqual(t, n, 4)
}

// With RABBITMQ_URL the tour publishes a message too, which the demo's own
// consumer receives.
func TestDemoPublishesToRabbitMQ(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	p := start(t, dbEnv(schema, "RABBITMQ_URL="+amqptest.URL(t)), "demo", "--interval", "50ms")
	p.stdout.waitFor(t, "The tour took", time.Minute)
	out := p.stdout.String()
	require.Regexp(t, `(?m)^job (\d+) +rabbitmq +attempt 1 .* done\n +receiver: queue amq\.gen-\S+ got message_id \d+, body \{"event":"shipped","order_id":1042\}`, out)
	require.Contains(t, out, "10 jobs, 9 delivered (1 after a retry), 1 dead")
	require.NotContains(t, out, "guest:guest", "RABBITMQ_URL's password is never printed")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
}

// `pgdispatch demo | head`: when the reader of its output goes, demo shuts
// down as on SIGTERM, and its throwaway cluster is stopped, not left running.
func TestDemoStopsWhenItsOutputCloses(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "demo", "--interval", "50ms")
	cmd.Env = env()
	cmd.Dir = t.TempDir()
	stderr := newSyncBuffer()
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	// Read up to the cluster's address and the first dispatch, as head would.
	// A demo that hangs is killed, which ends the read.
	hung := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	defer hung.Stop()
	var read bytes.Buffer
	buf := make([]byte, 4096)
	upAt := regexp.MustCompile(`PostgreSQL is up at (\S+)`)
	for !strings.Contains(read.String(), "after commit") {
		n, err := out.Read(buf)
		require.NoError(t, err, "stdout so far:\n%s\nstderr:\n%s", read.String(), stderr.String())
		read.Write(buf[:n])
	}
	m := upAt.FindStringSubmatch(read.String())
	require.NotNil(t, m, read.String())
	url := m[1]
	require.NoError(t, out.Close())

	select {
	case <-done:
		require.NoError(t, waitErr, stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("demo went on after its output closed; stderr:\n%s", stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		_ = conn.Close(ctx)
	}
	require.Error(t, err, "the throwaway cluster at %s is still running", url)
}

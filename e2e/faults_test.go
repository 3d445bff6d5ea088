package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// The scenarios run one after another: some restart the shared cluster.

const slots = 8 // CONCURRENCY of every worker in these scenarios

// hookPayload makes http_callback jobs to a receiver that takes 50ms to
// answer: with a job every 5ms, each worker has a few in flight at a fault.
// The job's flow key, if any, is in the body too, as "f".
func hookPayload(r *receiver) func(key, flowKey string) any {
	return func(key, flowKey string) any {
		data := map[string]any{"k": key}
		if flowKey != "" {
			data["f"] = flowKey
		}
		return map[string]any{"url": r.url("/hook?delay=50ms"), "data": data}
	}
}

// stream is a scenario with three workers and a producer of http_callback
// jobs to a receiver, running until finish.
type stream struct {
	s    *scenario
	r    *receiver
	ws   []*worker
	p    *producer
	stop context.CancelFunc

	// With flow limits: the limits, the sampler of the running jobs by key
	// (from the start until the drain is over), and, by key, the jobs the
	// workers killed held when they died (killed).
	limits  *flowLimits
	running *runningSampler
	held    map[string]int
}

// startStream starts a stream; limits, if not nil, gives its jobs flow keys
// and declares the limits on its queue before any job is written.
func startStream(t *testing.T, name string, env map[string]string, limits *flowLimits) *stream {
	s := newScenario(t, name, env)
	s.dumpLogsOnFailure()
	r := newReceiver(t)
	st := &stream{s: s, r: r, limits: limits, held: map[string]int{}}
	var flowKey func(int) string
	if limits != nil {
		s.declareLimits(limits)
		flowKey = limits.key
		st.running = s.sampleRunning()
	}
	st.ws = s.startWorkers(3)
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	st.stop = stop
	st.p = s.produce(ctx, name, 5*time.Millisecond, "http_callback", flowKey, hookPayload(r))
	return st
}

// killed records the jobs of w, just killed, by flow key.
func (st *stream) killed(w *worker) {
	if st.limits == nil {
		return
	}
	for k, n := range st.s.heldBy(w.id) {
		st.held[k] += n
	}
}

// end stops the producer and waits until every job is finished; it returns
// the committed keys.
func (st *stream) end(t *testing.T, drainFor time.Duration) []string {
	st.stop()
	keys := st.p.wait(t)
	st.s.drain(drainFor)
	return keys
}

// check verifies the deliveries of keys, the limits, that every worker
// still serves, and the logs.
func (st *stream) check(keys []string, dupBound int) {
	st.s.verify(keys, st.r.deliveries(), st.r.deliveryTimes(), dupBound)
	if st.limits != nil {
		st.checkLimits()
	}
	st.s.checkServing(st.r, slots)
	st.s.grepLogs()
}

// checkLimits asserts that no key ever had more jobs running than its
// limit, in the database, sampled from the start to the end of the drain;
// and at the receiver, counting the requests of each key in flight, at most
// its limit plus the jobs of the key that killed workers held. A killed
// worker's jobs stay running, and count against their keys, until their
// leases expire; then they run again. Their first requests end when the
// receiver sees the dead worker's connections closed, at once in practice,
// but the receiver cannot tell that apart from a request still in flight:
// each such job can overlap once with its own run after the lease, and the
// bound allows for exactly that.
func (st *stream) checkLimits() {
	t, l := st.s.t, st.limits
	most, samples, failed := st.running.end()
	atReceiver := st.r.flowMostInflight()
	t.Logf("limits %s: the most in flight at the receiver by key %v; the jobs killed workers held by key %v", st.s.name, atReceiver, st.held)
	checkRunning(t, st.s.name, l, most, samples, failed)
	for k, n := range atReceiver {
		require.LessOrEqual(t, n, l.limit(k)+st.held[k],
			"key %s had %d requests in flight at once at the receiver: over its limit of %d and the %d jobs of it killed workers held", k, n, l.limit(k), st.held[k])
	}
}

// strike runs fault n times, interval apart, and returns after one more
// interval, so that work goes on after the last fault however long the
// faults took on a loaded machine.
func strike(n int, interval time.Duration, fault func()) int {
	t := time.NewTicker(interval)
	defer t.Stop()
	for range n {
		<-t.C
		fault()
	}
	<-t.C
	return n
}

// Scenario 1: kill -9 a random worker every few seconds while three drain a
// steady stream, restarting it each time. The dead worker's jobs come back
// when their leases expire (the sweeper), their attempts counted.
func TestKillWorkers(t *testing.T) {
	skipShort(t)
	killWorkers(t, "kill9", nil)
}

// Scenario 1 under flow limits: nine keys, each at most 2 running, one of
// them strict. A killed worker's jobs hold their keys' places until their
// leases expire; run again, they stay within the limits.
func TestKillWorkersWithLimits(t *testing.T) {
	skipShort(t)
	killWorkers(t, "kill9_flow", &flowLimits{keys: 8, concurrency: 2, strict: "f3"})
}

func killWorkers(t *testing.T, name string, limits *flowLimits) {
	st := startStream(t, name, nil, limits)
	s, ws := st.s, st.ws
	restarts := 0
	kills := strike(4, streamFor/5, func() {
		i := rand.IntN(len(ws))
		s.fault(ws[i].kill9)
		st.killed(ws[i])
		restarts++
		ws[i] = s.startWorker(fmt.Sprintf("%s-%d-r%d", s.name, i+1, restarts))
		s.waitListening(ws[i])
	})
	keys := st.end(t, 60*time.Second)
	rescued := 0
	for _, w := range s.live() {
		rescued += strings.Count(w.log.String(), "lease expired: job back to pending")
	}
	rows := s.rowsByKey()
	again := 0
	for _, k := range keys {
		if rows[k].attempts > 1 { // only a kill makes a second attempt here
			again++
		}
	}
	t.Logf("%s: %d jobs of killed workers ran again, %d rescued by the sweeper", name, again, rescued)
	require.Positive(t, again, "no killed worker held a job: the scenario did not exercise recovery")
	// A killed worker can have had every slot in flight.
	st.check(keys, kills*slots)
}

// Scenario 2: terminate every pgdispatch session again and again: the pool's
// connections, the listener's and the sleep key's.
func TestTerminateConnections(t *testing.T) {
	skipShort(t)
	st := startStream(t, "terminate", nil, nil)
	s := st.s
	var sessions []int
	terminations := strike(5, streamFor/6, func() {
		// Each strike waits for the workers to be back, each with its
		// listener and a pool connection: on a loaded machine the strike
		// before could still be fresh (a listener reconnects after its
		// retry delay).
		var back int
		wait.For(t, 30*time.Second, "three workers' sessions back before the next termination", func() bool {
			callCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := s.pool.QueryRow(callCtx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name LIKE 'pgdispatch%' AND datname = current_database()`).Scan(&back)
			return err == nil && back >= 6
		})
		s.fault(func() {
			callCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var n int
			err := s.pool.QueryRow(callCtx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name LIKE 'pgdispatch%' AND datname = current_database()`).Scan(&n)
			require.NoError(t, err)
			sessions = append(sessions, n)
		})
	})
	keys := st.end(t, 60*time.Second)
	for i, n := range sessions {
		// Three workers hold at least a listener and a pool connection each.
		require.GreaterOrEqual(t, n, 6, "termination %d found only %d pgdispatch sessions", i+1, n)
	}
	// An outcome lost with its connection is written again; only a claim
	// whose answer was lost waits for its lease, and runs once.
	st.check(keys, terminations*3*slots)
}

// Scenario 3: restart PostgreSQL (pg_ctl restart -m fast) mid-stream. The
// workers reconnect on their own.
func TestRestartPostgres(t *testing.T) {
	skipShort(t)
	restartPostgres(t, "restart", nil)
}

// Scenario 3 under flow limits: eight keys, each at most 2 running. The
// running jobs of each key survive the restart in the table, and the
// claims after it count them.
func TestRestartPostgresWithLimits(t *testing.T) {
	skipShort(t)
	restartPostgres(t, "restart_flow", &flowLimits{keys: 8, concurrency: 2})
}

func restartPostgres(t *testing.T, name string, limits *flowLimits) {
	st := startStream(t, name, nil, limits)
	restarts := strike(2, streamFor/3, func() {
		st.s.fault(func() {
			restartCtx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			require.NoError(t, cluster.Restart(restartCtx))
		})
	})
	keys := st.end(t, 60*time.Second)
	st.check(keys, restarts*3*slots)
}

// Scenario 5: the receiver answers 500 for a while, then hangs past the job
// timeout, then recovers. Every job ends done with its attempts recorded,
// and no slot stays stuck on a hung request.
func TestFailingReceiver(t *testing.T) {
	skipShort(t)
	// Without the breaker: it would open the endpoint during the failing
	// phase and send nothing while the receiver hangs, which this scenario
	// exercises (TestBreakerOpensAndHeals has the breaker's own).
	st := startStream(t, "receiver", map[string]string{"JOB_TIMEOUT": "1s", "HTTP_BREAKER": "false"}, nil)
	s, r := st.s, st.r
	phase := time.NewTicker(streamFor / 4)
	<-phase.C
	s.fault(func() {
		r.mode.Store(recvFail)
		<-phase.C
		r.mode.Store(recvHang)
		<-phase.C
		r.mode.Store(recvOK)
	})
	<-phase.C
	phase.Stop()
	keys := st.end(t, 90*time.Second)

	r.mu.Lock()
	hung := r.hung
	r.mu.Unlock()
	require.Positive(t, hung, "no request hung until the job timeout")
	rows := s.rowsByKey()
	retried := 0
	for _, k := range keys {
		if rows[k].attempts > 1 {
			retried++
		}
	}
	require.Positive(t, retried, "no job needed a second attempt: the faults did not bite")
	t.Logf("receiver: %d of %d jobs retried, %d requests hung until the timeout", retried, len(keys), hung)
	// Answers are recorded only when they succeed, and no process died:
	// every job was delivered exactly once.
	st.check(keys, 0)
}

// Scenario 4: close the workers' broker connections mid-stream of rabbitmq
// jobs. A job is done only when the broker confirmed its message, so every
// done job's message is in the queue.
func TestCloseBrokerConnections(t *testing.T) {
	skipShort(t)
	b := newBroker(t, "pgdispatch_e2e")
	s := newScenario(t, "rabbit", map[string]string{"RABBITMQ_URL": b.url})
	s.dumpLogsOnFailure()
	s.startWorkers(3)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	p := s.produce(ctx, s.name, 5*time.Millisecond, "rabbitmq", nil, func(key, _ string) any {
		return map[string]any{"routing_key": b.queue, "body": map[string]any{"k": key}}
	})
	closes := strike(3, streamFor/4, func() { s.fault(func() { b.closeAll(t) }) })
	stop()
	keys := p.wait(t)
	s.drain(90 * time.Second)
	got, times := b.receive(t)
	s.verify(keys, got, times, closes*3*slots)
	require.Contains(t, s.logs(), "reconnected to the broker", "no worker saw its connection closed")
	s.grepLogs()
}

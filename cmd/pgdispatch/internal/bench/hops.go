package bench

import (
	"context"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
)

// The marks a lone job passes on its way, in order. commit is when the
// producer's commit returned; notified when the worker's listener heard the
// notification that woke the claim that took the job; claimSent when that
// claim had been sent; claimReturned when its transaction end had been read;
// started when the executor was called; written (http) when the client had
// written the request's headers (httptrace's WroteHeaders: the request
// leaves with its body in the flush that follows); received when the
// receiver on loopback began to serve it.
const (
	markCommit = iota
	markNotified
	markClaimSent
	markClaimReturned
	markStarted
	markWritten
	markReceived
	nMarks
)

// hopNames name the breakdown's figures: the time from one mark to the next
// one known, and commit_to_claim_sent for every job, notified or not.
var hopNames = [nMarks]string{
	markNotified:      "commit_to_notified",
	markClaimSent:     "notified_to_claim_sent",
	markClaimReturned: "claim_sent_to_returned",
	markStarted:       "returned_to_started",
	markWritten:       "started_to_written",
	markReceived:      "written_to_received",
}

// marks are one job's marks, zero where unknown.
type marks [nMarks]time.Time

// hops records, through the worker's test hooks (internal/testhook), when
// each lone job passed each mark, on the process's monotonic clock, the
// producers' and the receiver's clock too. Only the latency and http
// scenarios set it: a worker without it calls no hook.
type hops struct {
	mu       sync.Mutex
	notified []time.Time // every notification the listener heard, in order
	lastSent time.Time   // when the claim loop's last claim was sent
	sent     map[int64]time.Time
	returned map[int64]time.Time
	started  map[int64]time.Time
	written  map[int64]time.Time
}

func newHops() *hops {
	return &hops{sent: map[int64]time.Time{}, returned: map[int64]time.Time{}, started: map[int64]time.Time{}, written: map[int64]time.Time{}}
}

// hooks are the worker's hooks that record the marks. The claims of one
// queue are sent one after another on its claim loop, so a job's claim is
// the last one sent before the job came back.
func (h *hops) hooks() *testhook.Hooks {
	return &testhook.Hooks{
		Notified: func(string) {
			now := time.Now()
			h.mu.Lock()
			h.notified = append(h.notified, now)
			h.mu.Unlock()
		},
		ClaimSent: func(string) {
			now := time.Now()
			h.mu.Lock()
			h.lastSent = now
			h.mu.Unlock()
		},
		ClaimReturned: func(_ string, id int64) {
			now := time.Now()
			h.mu.Lock()
			h.sent[id], h.returned[id] = h.lastSent, now
			h.mu.Unlock()
		},
	}
}

// marks are job id's marks as the worker's hooks saw them, sentAt when its
// insert was sent: the caller adds its commit, and what it saw itself. Its
// notification is the last one the listener heard after the insert was
// sent and before the job's claim was: none when a look, not a
// notification, found the job.
func (h *hops) marks(id int64, sentAt time.Time) marks {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := marks{markClaimSent: h.sent[id], markClaimReturned: h.returned[id], markStarted: h.started[id], markWritten: h.written[id]}
	for i := len(h.notified) - 1; i >= 0; i-- {
		n := h.notified[i]
		if n.After(m[markClaimSent]) {
			continue
		}
		if n.After(sentAt) {
			m[markNotified] = n
		}
		break
	}
	return m
}

// start records that job id's executor was called.
func (h *hops) start(id int64) {
	now := time.Now()
	h.mu.Lock()
	h.started[id] = now
	h.mu.Unlock()
}

// tracedExecutor is the http scenario's http_callback executor, which
// records when it was called and when the client wrote each request's
// headers.
type tracedExecutor struct {
	exec executors.Executor
	hops *hops
}

func (t tracedExecutor) Execute(ctx context.Context, job *executors.Job) error {
	t.hops.start(job.ID)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() {
		now := time.Now()
		t.hops.mu.Lock()
		t.hops.written[job.ID] = now
		t.hops.mu.Unlock()
	}})
	return t.exec.Execute(ctx, job)
}

// addBreakdown adds to r, for jobs' marks, the p50, p90 and p99 of each hop
// (its figures named after hopNames) over the jobs that passed both of its
// marks, commit_to_claim_sent over every job, and jobs_notified: the jobs
// claimed after their notification was heard.
func addBreakdown(r *Result, jobs []marks) {
	var hop [nMarks][]time.Duration
	var toSent []time.Duration
	notified := 0
	for _, m := range jobs {
		if !m[markNotified].IsZero() {
			notified++
		}
		if !m[markClaimSent].IsZero() {
			toSent = append(toSent, m[markClaimSent].Sub(m[markCommit]))
		}
		for i := markNotified; i < nMarks; i++ {
			if !m[i-1].IsZero() && !m[i].IsZero() {
				hop[i] = append(hop[i], m[i].Sub(m[i-1]))
			}
		}
	}
	r.set("jobs_notified", float64(notified))
	addHop(r, "commit_to_claim_sent", toSent)
	for i := markNotified; i < nMarks; i++ {
		addHop(r, hopNames[i], hop[i])
	}
}

// addHop adds the p50, p90 and p99 of ds, which may be below 0, as name's.
func addHop(r *Result, name string, ds []time.Duration) {
	if len(ds) > 0 {
		addQuantiles(r, name, ds)
	}
}

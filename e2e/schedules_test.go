package e2e

import (
	"context"
	"fmt"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Scenario 9: two workers fire a schedule every second. The worker that
// holds the schedule's row in the middle of its pass is frozen (SIGSTOP)
// for 3 s, then thawed; later the one holding it is killed (kill -9).
// Every slot gets exactly one job, late rather than never: the other
// worker fires the held slots once the server has ended the holder's
// session, after its idle timeout (frozen) or at once (killed).
func TestScheduleHolderFreezesOrDies(t *testing.T) {
	skipShort(t)
	s := newScenario(t, "schedhold", nil)
	s.dumpLogsOnFailure()
	// Each worker's sessions carry its id, so that the test knows whose
	// session holds the row.
	byApp := map[string]*worker{}
	var apps []string
	for i := range 2 {
		id := fmt.Sprintf("%s-%d", s.name, i+1)
		u, err := url.Parse(s.url)
		require.NoError(t, err)
		q := u.Query()
		q.Set("application_name", "pgdispatch-"+id)
		u.RawQuery = q.Encode()
		w := s.startWorker(id, "DATABASE_URL="+u.String())
		byApp["pgdispatch-"+id] = w
		apps = append(apps, "pgdispatch-"+id)
	}
	for _, w := range byApp {
		s.waitListening(w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const name = "e2e-every-second"
	_, err := s.pool.Exec(ctx, "SELECT "+s.ident()+".schedule($1, NULL, 'noop', every => '1 second', catch_up => 'all')", name)
	require.NoError(t, err)
	jobs := func() (n int) {
		t.Helper()
		require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.jobs()+" WHERE starts_with(dedup_key, 'schedule:')").Scan(&n))
		return n
	}
	waitJobs := func(n int) {
		t.Helper()
		if !assert.Eventually(t, func() bool { return jobs() >= n }, 30*time.Second, 10*time.Millisecond, "the schedule's jobs never reached %d", n) {
			var state string
			_ = s.pool.QueryRow(ctx, `SELECT (SELECT json_agg(s) FROM `+s.ident()+`.schedules s)::text || E'\n' ||
				(SELECT json_agg(json_build_object('app', application_name, 'state', state, 'xid', backend_xid, 'xact', xact_start, 'query', left(query, 80)))
				 FROM pg_stat_activity WHERE application_name LIKE 'pgdispatch-%')::text`).Scan(&state)
			t.Fatalf("the schedule and the sessions:\n%s", state)
		}
	}
	waitJobs(2)

	// held waits for a worker's pass to hold the schedule's row (its xmax
	// is the xid of the pass's transaction), and returns whose it is.
	held := func() (app string, xid string) {
		t.Helper()
		for ctx.Err() == nil {
			err := s.pool.QueryRow(ctx, `SELECT a.application_name, a.backend_xid::text
				FROM pg_stat_activity a JOIN `+s.ident()+`.schedules s ON a.backend_xid = s.xmax
				WHERE s.name = $1 AND a.application_name = ANY($2)`, name, apps).Scan(&app, &xid)
			if err == nil {
				return app, xid
			}
			<-time.After(time.Millisecond)
		}
		t.Fatal("no pass was seen holding the schedule's row")
		return "", ""
	}
	// stopMidPass stops the worker whose pass holds the row, and returns
	// it once it stopped while still holding it; each try that stops it
	// too late lets it go on.
	stopMidPass := func() *worker {
		t.Helper()
		for try := 1; ; try++ {
			app, xid := held()
			w := byApp[app]
			require.NoError(t, w.cmd.Process.Signal(syscall.SIGSTOP))
			<-time.After(200 * time.Millisecond) // a statement on its way ends meanwhile
			var still bool
			require.NoError(t, s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity a JOIN `+s.ident()+`.schedules s
				ON a.backend_xid = s.xmax WHERE s.name = $1 AND a.application_name = $2 AND a.backend_xid::text = $3)`,
				name, app, xid).Scan(&still))
			if still {
				t.Logf("worker %s stopped mid-pass at try %d", w.id, try)
				return w
			}
			require.NoError(t, w.cmd.Process.Signal(syscall.SIGCONT))
			require.Less(t, try, 30, "no worker could be stopped in the middle of its pass")
		}
	}

	frozen := stopMidPass()
	s.fault(func() {
		<-time.After(3 * time.Second) // frozen past the server's 2 s idle timeout
		require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGCONT))
	})
	killed := stopMidPass()
	s.fault(killed.kill9)
	after := jobs()
	waitJobs(after + 3) // the survivor fires on

	var runs, missed, taken int64
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT runs, missed, taken FROM "+s.ident()+".schedules WHERE name = $1", name).
		Scan(&runs, &missed, &taken))
	var (
		n, slots            int
		first, last         time.Time
		lateMax, lateMedian time.Duration
	)
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT run_at), min(run_at), max(run_at),
			max(created_at - run_at), percentile_cont(0.5) WITHIN GROUP (ORDER BY created_at - run_at)
		FROM `+s.jobs()+" WHERE starts_with(dedup_key, 'schedule:')").
		Scan(&n, &slots, &first, &last, &lateMax, &lateMedian))
	want := int(last.Sub(first)/time.Second) + 1
	t.Logf("summary %s: slots=%d jobs=%d runs=%d missed=%d taken=%d late_max=%s late_median=%s (frozen %s, killed %s)",
		s.name, want, n, runs, missed, taken, lateMax.Round(time.Millisecond), lateMedian.Round(time.Millisecond), frozen.id, killed.id)
	assert.Equal(t, want, n, "every slot from %s to %s has a job", first, last)
	assert.Equal(t, n, slots, "one job a slot")
	assert.EqualValues(t, n, runs)
	assert.Zero(t, missed)
	assert.Zero(t, taken)
	// The held slots came late: after the frozen session's idle timeout.
	assert.Greater(t, lateMax, time.Second, "no slot was late: the holder did not hold it")
	s.grepLogs()
}

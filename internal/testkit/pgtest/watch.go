package pgtest

import (
	"context"
	"encoding/json"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// JobState is a job's row as a Watcher last saw it.
type JobState struct {
	ID       int64   `json:"id"`
	Status   string  `json:"status"`
	Attempts int     `json:"attempts"`
	Error    *string `json:"last_error"`
	// Delay is run_at minus updated_at, in seconds: the backoff a retry got.
	Delay   float64 `json:"delay"`
	Deleted bool    `json:"deleted"`
}

// Watcher turns every change to a schema's jobs table into an event, so that
// tests wait on what happened instead of sleeping.
type Watcher struct {
	mu      sync.Mutex
	states  map[int64]JobState
	history map[int64][]JobState
	changed chan struct{} // closed and replaced on every event
}

// Watch installs a test-only trigger on schema's jobs table and listens to it
// until the test ends, when it removes the trigger.
func Watch(t testing.TB, schema string) *Watcher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	channel := schema + "_watch"
	fn := pgx.Identifier{schema, "test_watch"}.Sanitize()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	_, err := Pool(t).Exec(ctx, `
CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    PERFORM pg_notify(`+quoteLiteral(channel)+`, json_build_object(
        'id', r.id, 'status', r.status, 'attempts', r.attempts, 'last_error', left(r.last_error, 500),
        'delay', extract(epoch FROM r.run_at - r.updated_at), 'deleted', TG_OP = 'DELETE')::text);
    RETURN NULL;
END $$;
CREATE TRIGGER test_watch AFTER INSERT OR UPDATE OR DELETE ON `+jobs+`
    FOR EACH ROW EXECUTE FUNCTION `+fn+`();`)
	if err != nil {
		t.Fatalf("pgtest: install watch trigger: %v", err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: watch: %v", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatalf("pgtest: watch: %v", err)
	}
	w := &Watcher{states: map[int64]JobState{}, history: map[int64][]JobState{}, changed: make(chan struct{})}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(runCtx)
			if err != nil {
				return
			}
			var s JobState
			if err := json.Unmarshal([]byte(n.Payload), &s); err != nil {
				continue
			}
			w.mu.Lock()
			w.states[s.ID] = s
			w.history[s.ID] = append(w.history[s.ID], s)
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		stop() // cuts the wait short: the connection closes in the background
		<-done
		closeConn(conn)
		// The schema may serve another test: the trigger goes with its
		// function. Should this fail, the schema's reset drops it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		began := time.Now()
		_, err := ddlPool(t).Exec(ctx, "DROP FUNCTION IF EXISTS "+fn+"() CASCADE")
		ddl.add(&ddl.reset, began)
		if err != nil {
			t.Logf("pgtest: remove the watch trigger: %v", err)
		}
	})
	return w
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// Until waits until cond holds over the jobs' last states, failing the test
// after timeout. It returns the states that satisfied cond.
func (w *Watcher) Until(t testing.TB, timeout time.Duration, what string, cond func(map[int64]JobState) bool) map[int64]JobState {
	t.Helper()
	var snapshot map[int64]JobState
	wait.On(t, timeout, what, func() (bool, <-chan struct{}) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !cond(w.states) {
			return false, w.changed
		}
		snapshot = maps.Clone(w.states)
		return true, nil
	})
	return snapshot
}

// Status waits until job id reaches status and returns its state.
func (w *Watcher) Status(t testing.TB, id int64, status string, timeout time.Duration) JobState {
	t.Helper()
	states := w.Until(t, timeout, "job to be "+status, func(m map[int64]JobState) bool {
		return m[id].Status == status
	})
	return states[id]
}

// History is every state job id went through, oldest first.
func (w *Watcher) History(id int64) []JobState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]JobState(nil), w.history[id]...)
}

// UntilHistory waits until cond holds over every state job id went through,
// oldest first, failing the test after timeout.
func (w *Watcher) UntilHistory(t testing.TB, id int64, timeout time.Duration, what string, cond func([]JobState) bool) {
	t.Helper()
	w.Until(t, timeout, what, func(map[int64]JobState) bool { return cond(w.history[id]) })
}

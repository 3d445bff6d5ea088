package e2e

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// flowLimits are the flow limits a scenario's queue (default) runs under:
// each key may run concurrency jobs at once, and the key strict, if set, is
// held to one at a time in order; rated, if set, is a key whose starts are
// also limited to rate per per.
type flowLimits struct {
	keys        int
	concurrency int
	strict      string
	rated       string
	rate        int
	per         time.Duration
}

// key is the i-th job's flow key: f<i mod keys>, except that the strict key
// takes only one of every four of its turns, and one more key, f<keys>, the
// others. One job at a time, each 50 ms at the receiver and a claim, the
// strict key could not keep up with one of every keys jobs of a stream's
// (one every 40 ms with 8 keys), and its backlog would grow with the
// stream's length.
func (l *flowLimits) key(i int) string {
	k := fmt.Sprintf("f%d", i%l.keys)
	if k == l.strict && i/l.keys%4 != 0 {
		k = fmt.Sprintf("f%d", l.keys)
	}
	return k
}

// limit is the most jobs of key that may run at once.
func (l *flowLimits) limit(key string) int {
	if key == l.strict {
		return 1
	}
	return l.concurrency
}

// declareLimits declares l on the scenario's default queue with
// set_flow_limit, as an operator would.
func (s *scenario) declareLimits(l *flowLimits) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fn := s.ident() + ".set_flow_limit"
	_, err := s.pool.Exec(ctx, "SELECT "+fn+"('default', NULL, concurrency => $1)", l.concurrency)
	require.NoError(s.t, err)
	if l.strict != "" {
		_, err = s.pool.Exec(ctx, "SELECT "+fn+"('default', $1, strict => true)", l.strict)
		require.NoError(s.t, err)
	}
	if l.rated != "" {
		// A key's own row replaces the queue's: it says the concurrency again.
		_, err = s.pool.Exec(ctx, "SELECT "+fn+"('default', $1, concurrency => $2, rate => $3, per => $4)",
			l.rated, l.concurrency, l.rate, l.per)
		require.NoError(s.t, err)
	}
}

// runningSampler reads the running jobs of each flow key from the
// database every 20 ms until it is stopped, and keeps each key's most. A
// sample that fails (the server restarting) is counted and skipped.
type runningSampler struct {
	stop context.CancelFunc
	done chan struct{}

	mu              sync.Mutex
	most            map[string]int
	samples, failed int
}

func (s *scenario) sampleRunning() *runningSampler {
	ctx, stop := context.WithCancel(context.Background())
	rs := &runningSampler{stop: stop, done: make(chan struct{}), most: map[string]int{}}
	query := "SELECT flow_key, count(*) FROM " + s.jobs() + " WHERE status = 'running' AND flow_key IS NOT NULL GROUP BY flow_key"
	go func() {
		defer close(rs.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			running, err := s.runningByKey(ctx, query)
			rs.mu.Lock()
			if err != nil {
				rs.failed++
			} else {
				rs.samples++
				for k, n := range running {
					rs.most[k] = max(rs.most[k], n)
				}
			}
			rs.mu.Unlock()
		}
	}()
	s.t.Cleanup(func() { rs.end() })
	return rs
}

// runningByKey runs query, which returns a flow key and a count a row.
func (s *scenario) runningByKey(ctx context.Context, query string, args ...any) (map[string]int, error) {
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := s.pool.Query(callCtx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			key string
			n   int
		)
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		out[key] = n
	}
	return out, rows.Err()
}

// end stops the sampler and returns each key's most running jobs, and how
// many samples it took and how many failed.
func (rs *runningSampler) end() (most map[string]int, samples, failed int) {
	rs.stop()
	<-rs.done
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return maps.Clone(rs.most), rs.samples, rs.failed
}

// heldBy is, by flow key, the jobs the worker id holds: the running rows it
// claimed. Asked right after the worker is killed, it is the jobs that run
// again once their leases expire.
func (s *scenario) heldBy(id string) map[string]int {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := s.runningByKey(ctx, "SELECT flow_key, count(*) FROM "+s.jobs()+
		" WHERE status = 'running' AND flow_key IS NOT NULL AND locked_by = $1 GROUP BY flow_key", id)
	require.NoError(s.t, err)
	return held
}

// checkRunning asserts that the database never had more jobs of a key
// running than the key's limit, and that some key reached its limit, so
// that the limit held something back.
func checkRunning(t *testing.T, name string, l *flowLimits, most map[string]int, samples, failed int) {
	t.Helper()
	t.Logf("limits %s: %d samples of the running jobs by key (%d failed), the most of each key %v", name, samples, failed, most)
	require.Positive(t, samples, "the running jobs were never sampled")
	reached := false
	for k, n := range most {
		require.LessOrEqual(t, n, l.limit(k), "key %s had %d jobs running at once in the database, over its limit of %d", k, n, l.limit(k))
		reached = reached || n == l.limit(k)
	}
	require.True(t, reached, "no key ever had its limit's worth of jobs running: the limits held nothing back")
}

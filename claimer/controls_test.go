package claimer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

// waitStatus polls the row of job id until it reads want.
func waitStatus(ctx context.Context, t *testing.T, c *Claimer, jobs string, id int64, want string) {
	t.Helper()
	var status string
	for {
		require.NoError(t, c.cfg.Pool.QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", id).Scan(&status))
		if status == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %d stayed %s, never %s", id, status, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A result that PostgreSQL's jsonb cannot hold (a string with NUL, a lone
// surrogate, a number past numeric's range) is valid JSON to Go. It must
// not make the outcome statement fail: that would keep its job, and every
// outcome batched with it, running for ever.
func TestUnstorableResultDoesNotStickTheBatch(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]any{
		"nul":       map[string]string{"body": "a\x00b"},
		"surrogate": map[string]any{"raw": rawJSON(`"\udc00"`)},
		"number":    map[string]any{"raw": rawJSON(`1e1000000`)},
		"utf8":      map[string]any{"raw": rawJSON("\"\xff\"")},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			registry := executors.NewRegistry()
			registry.Register("noop", executors.Func(func(ctx context.Context, _ *executors.Job) error {
				_ = executors.RecordResult(ctx, v)
				return nil
			}))
			registry.Register("fail", executors.Func(func(ctx context.Context, _ *executors.Job) error {
				_ = executors.RecordResult(ctx, v)
				return executors.Permanent(errFailed)
			}))
			c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry})
			var done, dead int64
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('noop') RETURNING id").Scan(&done))
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('fail') RETURNING id").Scan(&dead))
			runClaimer(ctx, t, c)
			waitStatus(ctx, t, c, jobs, done, "done")
			waitStatus(ctx, t, c, jobs, dead, "dead")
		})
	}
}

type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

var errFailed = errorString("failed")

type errorString string

func (e errorString) Error() string { return string(e) }

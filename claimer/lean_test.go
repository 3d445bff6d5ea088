package claimer

import (
	"context"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
)

// A lean claim takes jobs the full claim would take, and when it takes
// nothing it tells what the full claim would tell: queues drawn at random,
// of three priorities, with jobs due and scheduled ahead, some locked by
// another transaction.
func TestLeanClaimTakesWhatTheFullClaimWould(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	rng := rand.New(rand.NewSource(1))
	offsets := []string{"-1 hour", "-1 second", "0", "1 hour", "2 hours"}
	for trial := 0; trial < 150; trial++ {
		_, err := pool.Exec(ctx, "DELETE FROM "+jobs)
		require.NoError(t, err)
		n := rng.Intn(7)
		var ids []int64
		for i := 0; i < n; i++ {
			var id int64
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority, run_at) VALUES ('noop', $1, now() + $2::interval) RETURNING id",
				rng.Intn(3), offsets[rng.Intn(len(offsets))]).Scan(&id))
			ids = append(ids, id)
		}
		var locked []int64
		for _, id := range ids {
			if rng.Intn(4) == 0 {
				locked = append(locked, id)
			}
		}
		var tx pgx.Tx
		if len(locked) > 0 {
			tx, err = pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "SELECT FROM "+jobs+" WHERE id = ANY($1) FOR UPDATE", locked)
			require.NoError(t, err)
		}
		limit := 1 + rng.Intn(4)
		claim := func(lean bool) ([]int64, machine.Result) {
			c.cursor.Reset()
			c.quiet = lean
			runs, r := claimNow(ctx, t, c, limit)
			var ids []int64
			for _, run := range runs {
				ids = append(ids, run.Job.ID)
			}
			return ids, r
		}
		leanIDs, leanR := claim(true)
		_, err = pool.Exec(ctx, "UPDATE "+jobs+" SET status = 'pending', attempts = 0, locked_by = NULL, locked_until = NULL WHERE id = ANY($1)", leanIDs)
		require.NoError(t, err)
		fullIDs, fullR := claim(false)
		if tx != nil {
			require.NoError(t, tx.Rollback(ctx))
		}
		slices.Sort(leanIDs)
		slices.Sort(fullIDs)
		for _, id := range leanIDs {
			require.Contains(t, fullIDs, id, "trial %d", trial)
		}
		if len(leanIDs) == 0 {
			require.Empty(t, fullIDs, "trial %d", trial)
			require.Equal(t, fullR.Stranded, leanR.Stranded, "trial %d", trial)
			require.Equal(t, fullR.Next == nil, leanR.Next == nil, "trial %d", trial)
			if fullR.Next != nil {
				require.InDelta(t, fullR.Next.Seconds(), leanR.Next.Seconds(), 2, "trial %d", trial)
			}
		} else {
			require.Equal(t, len(leanIDs) < limit, leanR.Untold, "trial %d", trial)
		}
	}
}

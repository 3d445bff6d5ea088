package claimer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// The batch statements must find their rows by id whatever the statistics
// say. Statistics taken while every job was pending once made the planner
// drive a 1,000-row completion from a scan for running rows, in a nested
// loop with a join filter: quadratic, about 1 s a batch. This checks the
// plans' shape, not their speed: generic plans (as prepared statements get),
// statistics from before the jobs ran.
func TestBatchPlansUseTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	conn, err := pgtest.Pool(t).Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, sql := range []string{
		"INSERT INTO " + jobs + " (kind) SELECT 'noop' FROM generate_series(1, 20000)",
		"ANALYZE " + jobs,
		"UPDATE " + jobs + " SET status = 'running', attempts = 1, locked_by = 'w', locked_until = now() + interval '1 minute' WHERE id <= 3000",
		"SET plan_cache_mode = force_generic_plan",
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	defer conn.Exec(ctx, "RESET plan_cache_mode") //nolint:errcheck

	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint(i + 1)
	}
	idArray := "'{" + strings.Join(ids, ",") + "}'"
	for name, tc := range map[string]struct{ sql, types, args string }{
		"claim":     {claimSQL, "text, int, text, float8, int", "'default', 1000, 'w', 30, 5"},
		"heartbeat": {heartbeatSQL, "bigint[], text, float8", idArray + ", 'w', 30"},
		"complete": {
			completeSQL, "bigint[], int[], text[], float8[], text[], bool[], bool, text",
			idArray + ", array_fill(1, ARRAY[1000]), array_fill('done'::text, ARRAY[1000]), array_fill(0::float8, ARRAY[1000]), " +
				"array_fill(NULL::text, ARRAY[1000]), array_fill(false, ARRAY[1000]), false, 'w'",
		},
	} {
		stmt := "plan_" + name
		_, err := conn.Exec(ctx, "PREPARE "+stmt+"("+tc.types+") AS "+withTable(tc.sql, jobs))
		require.NoError(t, err, name)
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+stmt+"("+tc.args+")")
		require.NoError(t, err, name)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		plan := strings.Join(lines, "\n")
		require.NotContains(t, plan, "Join Filter", "%s plan:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on jobs", "%s plan:\n%s", name, plan)
		_, err = conn.Exec(ctx, "DEALLOCATE "+stmt)
		require.NoError(t, err)
	}
}

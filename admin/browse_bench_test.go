package admin_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// BenchmarkPages measures the console's job list on a table of 1,000,000
// jobs of mixed statuses, queues and kinds: for each filter, the first page
// and the next one. It reports the p95 of the two statements together, as
// the server answers them (the round trip on loopback included).
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./admin/
func BenchmarkPages(b *testing.B) {
	const rows = 1_000_000
	schema := pgtest.FreshSchema(b)
	pool := pgtest.Pool(b)
	ctx := context.Background()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	start := time.Now()
	// 70% done, 15% pending (a third of them due later), 10% dead, 4%
	// cancelled, 1% running; 10 queues, 20 kinds; created over a week. Two
	// rare kinds, pending only: 1 pending job in 1,000 (150, three pages)
	// and 1 in 10,000 (15, less than a page, so the page reads to the end).
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (queue, kind, status, run_at, created_at, finished_at, last_error, locked_by, locked_until)
		SELECT 'q' || (i % 10), CASE WHEN i % 66700 = 77 THEN 'rare' WHEN i % 6670 = 77 THEN 'scarce' ELSE 'k' || (i % 20) END, s,
		       CASE WHEN s = 'pending' AND i % 3 = 0 THEN now() + interval '1 hour' ELSE c END, c,
		       CASE WHEN s IN ('done', 'dead', 'cancelled') THEN c + interval '2 seconds' END,
		       CASE WHEN s = 'dead' THEN CASE WHEN i % 7 = 0 THEN 'dial tcp: connection refused' ELSE 'receiver answered 500' END END,
		       CASE WHEN s = 'running' THEN 'w' || (i % 4) END,
		       CASE WHEN s = 'running' THEN now() + interval '1 minute' END
		FROM (SELECT i, now() - (`+strconv.Itoa(rows)+` - i) * interval '600 milliseconds' AS c,
		             CASE WHEN i % 100 < 70 THEN 'done' WHEN i % 100 < 85 THEN 'pending' WHEN i % 100 < 95 THEN 'dead'
		                  WHEN i % 100 < 99 THEN 'cancelled' ELSE 'running' END AS s
		      FROM generate_series(1, `+strconv.Itoa(rows)+`) i) g`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
	require.NoError(b, err)
	b.Logf("seeded %d jobs in %s", rows, time.Since(start).Round(time.Millisecond))
	a := admin.New(pool, schema, 30*time.Second)
	hourAgo := time.Now().Add(-time.Hour)

	for _, c := range []struct {
		name string
		f    admin.JobFilter
	}{
		{"all", admin.JobFilter{}},
		{"dead", admin.JobFilter{Statuses: []string{"dead"}}},
		{"pending_by_run_at", admin.JobFilter{Sort: "run_at", Asc: true}},
		{"pending_by_run_at_desc", admin.JobFilter{Sort: "run_at"}},
		{"kind_pending_by_run_at", admin.JobFilter{Kind: "k3", Sort: "run_at", Asc: true}},
		{"kind_pending_by_run_at_desc", admin.JobFilter{Kind: "k3", Sort: "run_at"}},
		{"scarce_kind_pending_by_run_at", admin.JobFilter{Kind: "scarce", Sort: "run_at", Asc: true}},
		{"rare_kind_pending_by_run_at", admin.JobFilter{Kind: "rare", Sort: "run_at", Asc: true}},
		{"queue_kind_pending_by_run_at", admin.JobFilter{Queue: "q3", Kind: "k3", Sort: "run_at", Asc: true}},
		{"queue_scarce_kind_pending_by_run_at", admin.JobFilter{Queue: "q3", Kind: "scarce", Sort: "run_at", Asc: true}}, // none: read to the end
		{"queue_pending_by_run_at", admin.JobFilter{Queue: "q3", Sort: "run_at", Asc: true}},
		{"queue_pending_by_run_at_desc", admin.JobFilter{Queue: "q3", Sort: "run_at"}},
		{"finished_by_finished_at", admin.JobFilter{Sort: "finished_at"}},
		{"dead_cancelled_by_finished_at", admin.JobFilter{Statuses: []string{"dead", "cancelled"}, Sort: "finished_at"}},
		{"running", admin.JobFilter{Statuses: []string{"running"}}},
		{"queue", admin.JobFilter{Queue: "q3"}},
		{"kind", admin.JobFilter{Kind: "k7"}},
		{"queue_kind_dead", admin.JobFilter{Queue: "q3", Kind: "k13", Statuses: []string{"dead"}}},
		{"error_text", admin.JobFilter{Statuses: []string{"dead"}, ErrorText: "refused"}},
		{"dead_last_hour", admin.JobFilter{Statuses: []string{"dead"}, TimeField: "finished_at", Since: hourAgo}},
		{"created_last_hour", admin.JobFilter{TimeField: "created_at", Since: hourAgo}},
		{"id", admin.JobFilter{ID: 500_000}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				t0 := time.Now()
				_, next, err := a.Page(ctx, c.f)
				require.NoError(b, err)
				if next != nil {
					f := c.f
					f.After = next
					_, _, err = a.Page(ctx, f)
					require.NoError(b, err)
				}
				took = append(took, time.Since(t0))
			}
			slices.Sort(took)
			p95 := took[(len(took)*95+99)/100-1] // nearest rank: the 19th of 20
			b.ReportMetric(float64(p95.Microseconds())/1000, "p95-ms")
		})
	}
}

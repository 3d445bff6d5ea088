// Package pinned sends the claimer's statements behind the settings that
// pin their plans, in one round trip and one transaction, and names the
// tables in them.
package pinned

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PlanSQL goes before each heartbeat and completion, in the same implicit
// transaction, and pins their plans: a generic plan, made once per
// connection (else each was planned anew at every call), that finds rows
// by key only, however the statistics looked when it was made (a plan made
// on a nearly empty table scanned the whole table ever after). The
// settings are the transaction's own. claimer/plan_test.go checks the plans.
const PlanSQL = planSettings + `,
       set_config('enable_bitmapscan', 'off', true)`

// planSettings are PlanSQL's settings but the last: claim_flow turns
// bitmap scans off itself (and sorts, and jit).
const planSettings = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_tidscan', 'on', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true),
       set_config('jit', 'off', true)`

// ScanPlanSQL is PlanSQL for the claim's scans and the look's, read in the
// claim index's order, without a sort, so that a plan made while the
// statistics said the table held no row (analyzed once a burst had
// drained: its pages and index entries are there, and no row is live)
// does not read jobs_schedule_idx from the cursor's run_at and sort every
// due job it finds, at every claim. The claim's one sort, of the jobs it
// took, then costs a disabled node's cost, which without jit off had the
// server compile the claim at every call (0.6 s).
const ScanPlanSQL = PlanSQL + `,
       set_config('enable_sort', 'off', true),
       set_config('enable_incremental_sort', 'off', true)`

// ClaimPlanSQL is ScanPlanSQL for the claim, which also commits without
// waiting for its WAL flush.
const ClaimPlanSQL = ScanPlanSQL + `,
       set_config('synchronous_commit', 'off', true)`

// FlowPlanSQL goes before claim_flow, which commits as the claim does.
// claim_flow turns sorts off itself, but not incremental sorts: its look
// for the jobs without a key, planned after a drained table was analyzed,
// read jobs_schedule_idx from a priority's first job and sorted every due
// job of the queue by id, at every claim that walked past the last key.
const FlowPlanSQL = planSettings + `,
       set_config('enable_incremental_sort', 'off', true),
       set_config('synchronous_commit', 'off', true)`

// OutcomePlanSQL is PlanSQL for the worker's outcomes, which also says
// they are (pgdispatch.outcome): a job they put back to pending for later
// notifies no sleeping claimer (migration 025); the worker wakes its own
// when the job is due.
const OutcomePlanSQL = PlanSQL + `,
       set_config('pgdispatch.outcome', 'on', true)`

// Sender sends a batch: a pool, or one of its connections.
type Sender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Send sends settings (PlanSQL or ClaimPlanSQL) and then sql, in one round
// trip and one transaction. Read the settings' result first.
func Send(ctx context.Context, to Sender, settings, sql string, args ...any) pgx.BatchResults {
	batch := &pgx.Batch{}
	batch.Queue(settings)
	batch.Queue(sql, args...)
	return to.SendBatch(ctx, batch)
}

// Exec runs sql after PlanSQL, as Send, and returns its tag once the
// transaction has committed.
func Exec(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (pgconn.CommandTag, error) {
	return ExecWith(ctx, pool, PlanSQL, sql, args...)
}

// ExecWith is Exec after settings (PlanSQL or OutcomePlanSQL).
func ExecWith(ctx context.Context, pool *pgxpool.Pool, settings, sql string, args ...any) (pgconn.CommandTag, error) {
	results := Send(ctx, pool, settings, sql, args...)
	_, err := results.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = results.Exec()
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	return tag, err
}

// WithSchema names schema's tables and functions in sql: {jobs}, {queues},
// {claim_flow} and {wake}.
func WithSchema(sql, schema string) string {
	return strings.NewReplacer("{jobs}", pgx.Identifier{schema, "jobs"}.Sanitize(),
		"{queues}", pgx.Identifier{schema, "queues"}.Sanitize(),
		"{claim_flow}", pgx.Identifier{schema, "claim_flow"}.Sanitize(),
		"{wake}", pgx.Identifier{schema, "wake"}.Sanitize()).Replace(sql)
}

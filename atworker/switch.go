package atworker

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxTableName bounds the table's name, so that the names made from it
// (the store, its functions and index) fit PostgreSQL's 63 bytes.
const maxTableName = 40

// Switch makes the AT Worker's table a bridge to pgdispatch's jobs, in one
// transaction whose lock waits are bounded by LockWait (see the package's
// documentation). On a table that is already a bridge it does nothing and
// reports AlreadySwitched; on a database without the table it returns
// ErrNoTable. ctx bounds the whole switch.
func Switch(ctx context.Context, db DB, o Options) (Plan, error) {
	if err := o.fill(); err != nil {
		return Plan{}, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return Plan{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := setLockTimeout(ctx, tx, o.LockWait); err != nil {
		return Plan{}, err
	}
	rel, err := find(ctx, tx, o.Table)
	if err != nil {
		return Plan{}, err
	}
	plan := Plan{Table: rel.ident(), Store: rel.store()}
	if rel.kind == "v" && rel.comment == marker(o.Schema) {
		plan.Store = pgx.Identifier{rel.schema, strings.TrimSuffix(rel.name, StoreSuffix) + StoreSuffix}.Sanitize()
		plan.AlreadySwitched = true
		return plan, nil
	}
	if rel.kind == "v" && strings.HasPrefix(rel.comment, "pgdispatch at-worker bridge") {
		return plan, fmt.Errorf("%s is already a bridge, to another pgdispatch schema (%s)", rel.ident(), rel.comment)
	}
	if rel.kind != "r" {
		return plan, fmt.Errorf("%s is not a table", rel.ident())
	}
	if len(rel.name) > maxTableName {
		return plan, fmt.Errorf("the name of %s is longer than %d bytes: rename the table first", rel.ident(), maxTableName)
	}
	if !o.DryRun {
		if err := lock(ctx, tx, rel.ident()); err != nil {
			return plan, fmt.Errorf("lock %s: %w (for more than %s; writers queue behind the wait, so retry rather than wait longer)", rel.ident(), err, o.LockWait)
		}
		// Another switch may have held the lock, and put its view in the
		// table's place: look again, as a switch started now would.
		if again, err := find(ctx, tx, o.Table); err != nil || again.oid != rel.oid {
			_ = tx.Rollback(ctx)
			if err != nil {
				return plan, err
			}
			return Switch(ctx, db, o)
		}
	}
	if err := actAsOwner(ctx, tx, rel, o.Schema); err != nil {
		return plan, err
	}
	// Names in what is read from the catalogs from here on are
	// schema-qualified, so that the bridge's SQL means the same to every
	// session.
	if _, err := tx.Exec(ctx, "SELECT set_config('search_path', 'pg_catalog, pg_temp', true)"); err != nil {
		return plan, err
	}
	cols, err := columns(ctx, tx, rel)
	if err != nil {
		return plan, err
	}
	byName, err := checkColumns(rel, cols)
	if err != nil {
		return plan, err
	}
	var (
		unique, taken, jobsExist bool
		jobIDs                   string
	)
	if err := tx.QueryRow(ctx, `
		SELECT EXISTS (SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		               WHERE i.indrelid = $1 AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = 'id'),
		       to_regclass($2) IS NOT NULL OR to_regprocedure($3) IS NOT NULL,
		       to_regclass($4) IS NOT NULL,
		       CASE WHEN to_regclass($4) IS NOT NULL THEN coalesce(pg_get_serial_sequence($4, 'id'), '') ELSE '' END`,
		rel.oid, rel.store(), rel.function("insert")+"()", jobsTable(o.Schema)).Scan(&unique, &taken, &jobsExist, &jobIDs); err != nil {
		return plan, err
	}
	switch {
	case !unique:
		return plan, fmt.Errorf("cannot switch %s: its column id has no unique index or primary key", rel.ident())
	case taken:
		return plan, fmt.Errorf("cannot switch %s: %s exists already", rel.ident(), rel.store())
	case !jobsExist:
		return plan, fmt.Errorf("schema %q is not installed in this database: run 'pgdispatch migrate' first", o.Schema)
	}
	plan.Rows = RowCounts{}
	rows, err := tx.Query(ctx, fmt.Sprintf("SELECT status::text, count(*) FROM %s GROUP BY 1", rel.ident()))
	if err != nil {
		return plan, err
	}
	var (
		status *string
		n      int64
		odd    []string
	)
	if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		s := "NULL"
		if status != nil {
			s = *status
		}
		plan.Rows[s] = n
		switch s {
		case Pending, Processing, Completed, Failed:
		default:
			odd = append(odd, fmt.Sprintf("%q (%d rows)", s, n))
		}
		return nil
	}); err != nil {
		return plan, err
	}
	for _, c := range cols {
		if !contains(contract, c.name) {
			plan.Columns = append(plan.Columns, c.name)
		}
	}
	b := bridge{rel: rel, schema: o.Schema, queue: o.Queue, cols: cols, byName: byName, meta: newMeta(o.StuckTimeout), jobIDs: jobIDs}
	plan.Statements = b.switchStatements()
	moved, err := moveGrants(ctx, tx, rel)
	if err != nil {
		return plan, err
	}
	plan.Statements = append(plan.Statements, moved...)
	if len(odd) > 0 {
		sort.Strings(odd)
		return plan, fmt.Errorf("cannot switch %s: rows have statuses other than pending, processing, completed and failed: %s",
			rel.ident(), strings.Join(odd, ", "))
	}
	if o.DryRun {
		return plan, nil
	}
	for _, sql := range plan.Statements {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return plan, fmt.Errorf("switch %s: %w\n%s", rel.ident(), err, sql)
		}
	}
	if err := checkStoreClosed(ctx, tx, rel); err != nil {
		return plan, err
	}
	return plan, tx.Commit(ctx)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// grantsSQL reads the privileges granted on a relation, its own and its
// columns', but those of its owner.
const grantsSQL = `
SELECT CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END, g.privilege_type, g.is_grantable, coalesce(quote_ident(g.col), '')
FROM (SELECT a.grantee, a.privilege_type, a.is_grantable, NULL::name AS col
      FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = $1 AND a.grantee <> c.relowner
      UNION ALL
      SELECT a.grantee, a.privilege_type, a.is_grantable, t.attname
      FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid AND t.attnum > 0 AND NOT t.attisdropped, aclexplode(t.attacl) a
      WHERE c.oid = $1 AND a.grantee <> c.relowner) g
LEFT JOIN pg_roles r ON r.oid = g.grantee
ORDER BY 1, 4, 2`

// grants are the GRANTs that give to the relation named to the privileges
// granted on the relation from, and the grantees.
func grants(ctx context.Context, tx pgx.Tx, from uint32, to string) (sql, grantees []string, err error) {
	rows, err := tx.Query(ctx, grantsSQL, from)
	if err != nil {
		return nil, nil, err
	}
	var (
		grantee, priv, col string
		grantable          bool
	)
	_, err = pgx.ForEachRow(rows, []any{&grantee, &priv, &grantable, &col}, func() error {
		if col != "" {
			priv += " (" + col + ")"
		}
		g := fmt.Sprintf("GRANT %s ON %s TO %s", priv, to, grantee)
		if grantable {
			g += " WITH GRANT OPTION"
		}
		sql = append(sql, g)
		if !contains(grantees, grantee) {
			grantees = append(grantees, grantee)
		}
		return nil
	})
	return sql, grantees, err
}

// moveGrants are the statements that give the view the privileges the
// table has, so that its producers and readers keep theirs, and take them
// from the store: the view's functions run as the table's owner, and a
// right on the store would let a role point a row at any job
// (JobIDColumn) or write the row's state around its job.
func moveGrants(ctx context.Context, tx pgx.Tx, rel relation) ([]string, error) {
	sql, grantees, err := grants(ctx, tx, rel.oid, rel.ident())
	if err != nil {
		return nil, fmt.Errorf("read the grants on %s: %w", rel.ident(), err)
	}
	if len(grantees) > 0 {
		sql = append(sql, fmt.Sprintf("REVOKE ALL ON %s FROM %s CASCADE", rel.store(), strings.Join(grantees, ", ")))
	}
	return sql, nil
}

// checkStoreClosed returns an error if a role other than its owner holds a
// privilege on the store.
func checkStoreClosed(ctx context.Context, tx pgx.Tx, rel relation) error {
	_, grantees, err := grants(ctx, tx, rel.oid, rel.store())
	if err != nil {
		return err
	}
	if len(grantees) > 0 {
		return fmt.Errorf("switch %s: privileges on %s remain to %s after the switch revoked them", rel.ident(), rel.store(), strings.Join(grantees, ", "))
	}
	return nil
}

// loadBridge reads the bridge of the view rel.
func loadBridge(ctx context.Context, tx pgx.Tx, rel relation, schema string) (bridge, error) {
	store, err := find(ctx, tx, rel.store())
	if err != nil {
		return bridge{}, fmt.Errorf("the store of %s: %w", rel.ident(), err)
	}
	cols, err := columns(ctx, tx, store)
	if err != nil {
		return bridge{}, err
	}
	var own []column
	byName := map[string]column{}
	for _, c := range cols {
		if c.name != JobIDColumn {
			own = append(own, c)
			byName[c.name] = c
		}
	}
	var comment string
	if err := tx.QueryRow(ctx, `SELECT coalesce(col_description($1, a.attnum), '') FROM pg_attribute a
		WHERE a.attrelid = $1 AND a.attname = $2`, store.oid, JobIDColumn).Scan(&comment); err != nil {
		return bridge{}, fmt.Errorf("the store of %s: %w", rel.ident(), err)
	}
	m, err := parseMeta(comment)
	if err != nil {
		return bridge{}, fmt.Errorf("the store of %s, %s: %w", rel.ident(), rel.store(), err)
	}
	return bridge{rel: rel, schema: schema, cols: own, byName: byName, meta: m}, nil
}

// RevertResult is what Revert did.
type RevertResult struct {
	Table string
	// NotSwitched is set when the table is no bridge: nothing was done.
	NotSwitched bool
	// Rows counts the table's rows by status, as they were restored.
	Rows RowCounts
	// Cancelled is the pending jobs cancelled, which the AT Worker runs
	// from now on.
	Cancelled int64
	// Running is the jobs pgdispatch was running: their rows were restored
	// as processing, and Wait writes their outcomes.
	Running []RunningJob
}

// RunningJob is a job that was running at the revert, and its row.
type RunningJob struct {
	JobID int64
	RowID string // the row's id, as text
}

// Revert makes the bridge's view a table again, with every row's current
// state, in one transaction: the store takes the table's name back, with
// its rows, columns, indexes, constraints and sequence, and the view's
// grants. Pending jobs are cancelled (the AT Worker runs their rows from
// now on). Jobs that were running keep running: their rows read
// processing, with updated_at now so that the AT Worker's cleaner leaves
// them alone for its stuck timeout, and Wait writes their outcomes. Every
// job stays in pgdispatch.jobs, until the sweeper purges it.
func Revert(ctx context.Context, db DB, o Options) (RevertResult, error) {
	if err := o.fill(); err != nil {
		return RevertResult{}, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return RevertResult{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := setLockTimeout(ctx, tx, o.LockWait); err != nil {
		return RevertResult{}, err
	}
	rel, err := find(ctx, tx, o.Table)
	if err != nil {
		return RevertResult{}, err
	}
	res := RevertResult{Table: rel.ident()}
	if rel.kind != "v" || rel.comment != marker(o.Schema) {
		if rel.kind == "r" {
			res.NotSwitched = true
			return res, nil
		}
		return res, fmt.Errorf("%s is not a bridge to schema %q", rel.ident(), o.Schema)
	}
	if !o.DryRun {
		if err := lock(ctx, tx, rel.ident(), rel.store()); err != nil {
			return res, fmt.Errorf("lock %s: %w (for more than %s)", rel.ident(), err, o.LockWait)
		}
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('search_path', 'pg_catalog, pg_temp', true)"); err != nil {
		return res, err
	}
	b, err := loadBridge(ctx, tx, rel, o.Schema)
	if err != nil {
		return res, err
	}
	store, jobs := rel.store(), b.jobs()
	lockSQL := fmt.Sprintf(`SELECT j.id, j.status, s.id::text FROM %s j JOIN %s s ON s.%s = j.id AND %s
		WHERE j.status IN ('pending', 'running') ORDER BY j.id`, jobs, store, JobIDColumn, b.ownJob())
	if !o.DryRun {
		lockSQL += " FOR UPDATE OF j"
	}
	rows, err := tx.Query(ctx, lockSQL)
	if err != nil {
		return res, err
	}
	var (
		pending []int64
		id      int64
		status  string
		rowID   string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &status, &rowID}, func() error {
		if status == "pending" {
			pending = append(pending, id)
		} else {
			res.Running = append(res.Running, RunningJob{JobID: id, RowID: rowID})
		}
		return nil
	}); err != nil {
		return res, err
	}
	res.Cancelled = int64(len(pending))
	// The table's privileges are the view's (see moveGrants).
	back, _, err := grants(ctx, tx, rel.oid, store)
	if err != nil {
		return res, fmt.Errorf("read the grants on %s: %w", rel.ident(), err)
	}
	// cancelSQL cancels the pending jobs, $1.
	cancelSQL := fmt.Sprintf(`UPDATE %s j SET status = 'cancelled', finished_at = now(), updated_at = now(),
    last_error = 'handed back to the AT Worker by pgdispatch at-worker revert'
WHERE j.id = ANY($1::bigint[]) AND j.status = 'pending'`, jobs)
	statements := []string{
		// Every row's current state, as the view shows it, where the store
		// does not hold it already; running jobs' rows are processing from
		// now on. A row an AT Worker was processing at the switch, whose
		// job has not run here, goes back as it was: processing, with its
		// updated_at, for the AT Worker's cleaner to judge.
		fmt.Sprintf("UPDATE %s s SET %s FROM %s j WHERE j.id = s.%s AND %s AND NOT %s AND NOT %s", store,
			b.settleSet(fmt.Sprintf("CASE WHEN j.status = 'running' THEN now() ELSE j.updated_at::%s END", b.typ("updated_at"))),
			jobs, JobIDColumn, b.ownJob(), stored, b.held()),
		// Rows whose job is gone before it was settled: done and deleted
		// at once (see Settle).
		fmt.Sprintf("UPDATE %s s SET status = 'completed' WHERE s.status NOT IN ('completed', 'failed') AND NOT EXISTS (SELECT FROM %s j WHERE j.id = s.%s AND %s)",
			store, jobs, JobIDColumn, b.ownJob()),
		cancelSQL,
	}
	statements = append(statements, back...)
	statements = append(statements,
		fmt.Sprintf("DROP VIEW %s", rel.ident()),
		fmt.Sprintf("DROP FUNCTION %s(), %s(), %s()", rel.function("insert"), rel.function("update"), rel.function("delete")),
		fmt.Sprintf("ALTER TABLE %s DROP COLUMN %s", store, JobIDColumn),
		fmt.Sprintf("ALTER TABLE %s RENAME TO %s", store, pgx.Identifier{rel.name}.Sanitize()),
	)
	if o.DryRun {
		res.Rows, err = countByStatus(ctx, tx, rel.ident())
		return res, err
	}
	for _, sql := range statements {
		var args []any
		if sql == cancelSQL {
			args = []any{pending}
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return res, fmt.Errorf("revert %s: %w", rel.ident(), err)
		}
	}
	if res.Rows, err = countByStatus(ctx, tx, rel.ident()); err != nil {
		return res, err
	}
	return res, tx.Commit(ctx)
}

func countByStatus(ctx context.Context, tx pgx.Tx, table string) (RowCounts, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf("SELECT status::text, count(*) FROM %s GROUP BY 1", table))
	if err != nil {
		return nil, err
	}
	out := RowCounts{}
	var (
		s string
		n int64
	)
	_, err = pgx.ForEachRow(rows, []any{&s, &n}, func() error { out[s] = n; return nil })
	return out, err
}

// WaitResult is what Wait did with the jobs that were running at a revert.
type WaitResult struct {
	Finished int // written into their rows as completed or failed
	Retried  int // failed and due again: cancelled, and their rows pending for the AT Worker
	// Cut are the jobs still running when the wait ended, and their rows:
	// cancelled, and the rows made pending, so that the AT Worker runs them
	// again. An attempt cut short may have delivered already.
	Cut []RunningJob
}

// Wait waits up to wait for the jobs that were running at a revert to end,
// and writes each outcome into its row of table (Revert's Table) while the
// row is still processing. A job that failed and would be retried is
// cancelled, and its row made pending for the AT Worker; the jobs still
// running when the wait ends are cancelled (pgdispatch.cancel: their
// workers stop the attempts) and their rows made pending. Every statement
// is bounded by timeout.
func Wait(ctx context.Context, db DB, schema, table string, running []RunningJob, wait, timeout time.Duration) (WaitResult, error) {
	var res WaitResult
	left := map[int64]string{}
	for _, r := range running {
		left[r.JobID] = r.RowID
	}
	jobs := jobsTable(schema)
	deadline := time.Now().Add(wait)
	writeN := func(sql string, args ...any) (int64, error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		tag, err := db.Exec(cctx, sql, args...)
		return tag.RowsAffected(), err
	}
	write := func(sql string, args ...any) error {
		_, err := writeN(sql, args...)
		return err
	}
	var idType string
	{
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := db.QueryRow(cctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'id'`, table).Scan(&idType)
		cancel()
		if err != nil && len(left) > 0 {
			return res, err
		}
	}
	for len(left) > 0 {
		ids := make([]int64, 0, len(left))
		for id := range left {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		cctx, cancel := context.WithTimeout(ctx, timeout)
		rows, err := db.Query(cctx, fmt.Sprintf(`SELECT id, status, attempts, run_at, finished_at, last_error FROM %s
			WHERE id = ANY($1) AND status <> 'running' ORDER BY id`, jobs), ids)
		if err != nil {
			cancel()
			return res, err
		}
		type outcome struct {
			id         int64
			status     string
			attempts   int32
			runAt      time.Time
			finishedAt *time.Time
			lastError  *string
		}
		var done []outcome
		var o outcome
		_, err = pgx.ForEachRow(rows, []any{&o.id, &o.status, &o.attempts, &o.runAt, &o.finishedAt, &o.lastError}, func() error {
			done = append(done, o)
			return nil
		})
		cancel()
		if err != nil {
			return res, err
		}
		for _, o := range done {
			rowID := left[o.id]
			delete(left, o.id)
			where := fmt.Sprintf(" WHERE id = $1::%s AND status = 'processing'", idType)
			switch o.status {
			case "done":
				err = write("UPDATE "+table+" SET status = 'completed', attempts = $2, completed_at = $3, updated_at = now()"+where, rowID, o.attempts, o.finishedAt)
				res.Finished++
			case "pending":
				var cancelled int64
				if cancelled, err = writeN("UPDATE "+jobs+" SET status = 'cancelled', finished_at = now(), updated_at = now(), "+
					"last_error = 'handed back to the AT Worker by pgdispatch at-worker revert' WHERE id = $1 AND status = 'pending'", o.id); err == nil {
					if cancelled == 0 {
						// A worker claimed it again meanwhile: wait for
						// that attempt.
						left[o.id] = rowID
						continue
					}
					err = write("UPDATE "+table+" SET status = 'pending', attempts = $2, execute_at = $3, error_message = $4, updated_at = now()"+where,
						rowID, o.attempts, o.runAt, o.lastError)
				}
				res.Retried++
			default: // dead, cancelled
				err = write("UPDATE "+table+" SET status = 'failed', attempts = $2, error_message = $3, updated_at = now()"+where, rowID, o.attempts, o.lastError)
				res.Finished++
			}
			if err != nil {
				return res, err
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			ids = ids[:0]
			for id := range left {
				ids = append(ids, id)
			}
			sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
			if err := write("SELECT count(*) FROM "+pgx.Identifier{schema, "cancel"}.Sanitize()+"(VARIADIC $1::bigint[])", ids); err != nil {
				return res, err
			}
			for _, id := range ids {
				if err := write("UPDATE "+table+" SET status = 'pending', execute_at = now(), updated_at = now()"+
					fmt.Sprintf(" WHERE id = $1::%s AND status = 'processing'", idType), left[id]); err != nil {
					return res, err
				}
			}
			for _, id := range ids {
				res.Cut = append(res.Cut, RunningJob{JobID: id, RowID: left[id]})
			}
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return res, nil
}

// SettleBatch bounds the rows one statement of Settle writes.
const SettleBatch = 1000

// Settle writes the final state of the finished jobs of every bridge to
// schema into their store rows, so that scheduled_tasks still shows them
// once the sweeper has purged the jobs (after RETAIN_DONE and
// RETAIN_DEAD). Rows of other states, and rows already settled, are left
// alone. It returns the rows written. Each statement is bounded by
// timeout. A job purged before it was settled (RETAIN_DONE=0 deletes done
// jobs at once) leaves its row unsettled; the view and Revert read such a
// row as completed.
func Settle(ctx context.Context, db DB, schema string, timeout time.Duration) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	rels, err := bridges(cctx, db, schema)
	cancel()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, rel := range rels {
		n, err := settleOne(ctx, db, rel, schema, timeout)
		total += n
		if err != nil {
			return total, fmt.Errorf("settle %s: %w", rel.ident(), err)
		}
	}
	return total, nil
}

func settleOne(ctx context.Context, db DB, rel relation, schema string, timeout time.Duration) (int64, error) {
	var total int64
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		n, err := func() (int64, error) {
			tx, err := db.Begin(cctx)
			if err != nil {
				return 0, err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(cctx)) }()
			if _, err := tx.Exec(cctx, "SELECT set_config('search_path', 'pg_catalog, pg_temp', true)"); err != nil {
				return 0, err
			}
			b, err := loadBridge(cctx, tx, rel, schema)
			if err != nil {
				return 0, err
			}
			tag, err := tx.Exec(cctx, b.settleSQL(), SettleBatch)
			if err != nil {
				return 0, err
			}
			return tag.RowsAffected(), tx.Commit(cctx)
		}()
		cancel()
		total += n
		if err != nil || n < SettleBatch {
			return total, err
		}
	}
}

// bridges finds the bridges to schema by the comment on their views.
func bridges(ctx context.Context, db DB, schema string) ([]relation, error) {
	rows, err := db.Query(ctx, `
		SELECT c.oid, c.relkind::text, n.nspname, c.relname, d.description
		FROM pg_description d JOIN pg_class c ON c.oid = d.objoid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE d.classoid = 'pg_class'::regclass AND d.objsubid = 0 AND c.relkind = 'v' AND d.description = $1
		ORDER BY n.nspname, c.relname`, marker(schema))
	if err != nil {
		return nil, err
	}
	var (
		out []relation
		r   relation
	)
	_, err = pgx.ForEachRow(rows, []any{&r.oid, &r.kind, &r.schema, &r.name, &r.comment}, func() error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// Bridges lists the bridges to schema, as qualified names.
func Bridges(ctx context.Context, db DB, schema string) ([]string, error) {
	rels, err := bridges(ctx, db, schema)
	names := make([]string, len(rels))
	for i, r := range rels {
		names[i] = r.ident()
	}
	return names, err
}

// actAsOwner makes the rest of tx run as the owner of rel, so that the view
// and its functions are the owner's: the functions run with their owner's
// rights (SECURITY DEFINER), and the owner's rights are what the table's
// own triggers and policies ran with before. A switch run by another role
// (a superuser) would otherwise lend that role's rights to any trigger the
// owner puts on the store, and shut the owner out of its own table. The
// current role must be the owner or a member of it, and the owner needs
// rights on pgdispatch's jobs.
func actAsOwner(ctx context.Context, tx pgx.Tx, rel relation, schema string) error {
	var owner string
	var member bool
	if err := tx.QueryRow(ctx, `SELECT c.relowner::regrole::text, pg_has_role(current_user, c.relowner, 'MEMBER')
		FROM pg_class c WHERE c.oid = $1`, rel.oid).Scan(&owner, &member); err != nil {
		return err
	}
	if !member {
		return fmt.Errorf("run the switch as the owner of %s (%s), or as a role that is a member of it", rel.ident(), owner)
	}
	// owner is regrole's output: an identifier, quoted where it needs to be.
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+owner); err != nil {
		return err
	}
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT has_schema_privilege($1, 'USAGE')
		AND has_table_privilege($2, 'SELECT, INSERT, UPDATE, DELETE')
		AND has_sequence_privilege(pg_get_serial_sequence($2, 'id'), 'USAGE')`, schema, jobsTable(schema)).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("the owner of %s (%s) needs USAGE on schema %s, SELECT, INSERT, UPDATE and DELETE on %s, and USAGE on its id's sequence: the view's functions run as it",
			rel.ident(), owner, pgx.Identifier{schema}.Sanitize(), jobsTable(schema))
	}
	return nil
}

package atworker

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// bridge is what the SQL of one bridge is built from.
type bridge struct {
	rel    relation
	schema string // pgdispatch's
	queue  string
	cols   []column // the table's columns, in order
	byName map[string]column
	meta   meta
	jobIDs string // the sequence of the jobs' ids, as a qualified name
}

// key is the SQL expression of the dedup_key of the job the bridge makes
// for the row whose id is the expression id.
func (b bridge) key(id string) string {
	return fmt.Sprintf("(%s || %s::text)", literal(b.meta.KeyPrefix), id)
}

// ownJob is the condition that job j is the one the bridge made for store
// row s: a row pointed at any other job reads as if its job were gone.
func (b bridge) ownJob() string { return "j.dedup_key = " + b.key("s.id") }

// stored is the condition that store row s holds row's state, as the
// switch, a trigger or Settle wrote it, and job j has not changed since:
// the view then reads the store, so that a finished row's times are the
// table's own.
const stored = `(j.id IS NULL OR (s.status IN ('completed', 'failed') AND j.status IN ('done', 'dead', 'cancelled')
    AND j.updated_at = s.updated_at::timestamptz))`

// held is the condition that store row s was processing at the switch
// and its job j has not run here, nor changed, since: the row is the AT
// Worker's as it was, and Revert gives it back as it is.
func (b bridge) held() string {
	return fmt.Sprintf("(s.status = 'processing' AND j.status = 'pending' AND j.attempts = s.attempts AND j.run_at = s.updated_at::timestamptz + %s)",
		b.meta.grace())
}

func (b bridge) jobs() string { return jobsTable(b.schema) }

func (b bridge) typ(name string) string { return b.byName[name].typ }

// viewExpr is the view's expression for column c of store row s and job j
// (NULL once purged): the AT Worker's columns come from the job while it
// exists, cast to the table's types; every other column from the store.
func (b bridge) viewExpr(c column) string {
	s := "s." + c.ident()
	job := b.jobExpr(c.name)
	if job == "" {
		return s
	}
	if c.name == "status" {
		// A row left unsettled by a job that is gone was done and deleted
		// at once (RETAIN_DONE=0): see Settle.
		return fmt.Sprintf("CASE WHEN j.id IS NULL THEN CASE WHEN s.status IN ('completed', 'failed') THEN s.status ELSE 'completed'::%s END WHEN %s THEN s.status ELSE (%s)::%s END",
			c.typ, stored, job, c.typ)
	}
	return fmt.Sprintf("CASE WHEN %s THEN %s ELSE (%s)::%s END", stored, s, job, c.typ)
}

// jobExpr is the value of the AT Worker's column name read from job j and
// store row s, or "" for columns the store holds.
func (b bridge) jobExpr(name string) string {
	switch name {
	case "status":
		return "CASE j.status WHEN 'pending' THEN 'pending' WHEN 'running' THEN 'processing' WHEN 'done' THEN 'completed' ELSE 'failed' END"
	case "attempts":
		return "j.attempts"
	case "max_attempts":
		return fmt.Sprintf("coalesce(j.max_attempts::%s, s.max_attempts)", b.typ("max_attempts"))
	case "execute_at":
		// A row an AT Worker was processing at the switch keeps its
		// execute_at while its job is due when the switch made it due.
		return fmt.Sprintf("CASE WHEN s.status IN ('pending', 'processing') AND j.run_at = s.updated_at::timestamptz + %s THEN s.execute_at::timestamptz ELSE j.run_at END",
			b.meta.grace())
	case "updated_at":
		return "j.updated_at"
	case "completed_at":
		return "CASE WHEN j.status = 'done' THEN j.finished_at END"
	case "error_message":
		return "coalesce(j.last_error, CASE WHEN j.status = 'cancelled' THEN 'cancelled' END)"
	}
	return ""
}

// stateColumns are the store's columns that Settle and Revert write from
// the job.
var stateColumns = []string{"status", "attempts", "max_attempts", "execute_at", "updated_at", "completed_at", "error_message"}

// settleSet is the SET list that writes job j's state into store row s.
func (b bridge) settleSet(updatedAt string) string {
	var set []string
	for _, name := range stateColumns {
		c := b.byName[name]
		expr := fmt.Sprintf("(%s)::%s", b.jobExpr(name), c.typ)
		if name == "updated_at" && updatedAt != "" {
			expr = updatedAt
		}
		set = append(set, c.ident()+" = "+expr)
	}
	return strings.Join(set, ", ")
}

// jobValues is the jobs table's columns and the values of a job made from
// row r (s or NEW) of the AT Worker's table. At the switch, a row that was
// processing becomes due the stuck timeout after its updated_at.
func (b bridge) jobValues(r string, atSwitch bool) (cols, vals string) {
	col := func(name string) string { return r + "." + pgx.Identifier{name}.Sanitize() }
	status := col("status") + "::text"
	runAt := fmt.Sprintf("coalesce(%s::timestamptz, now())", col("execute_at"))
	if atSwitch {
		runAt = fmt.Sprintf("CASE WHEN %s = 'processing' THEN coalesce(%s::timestamptz, now()) + %s ELSE %s END",
			status, col("updated_at"), b.meta.grace(), runAt)
	}
	values := []string{
		literal(b.queue),
		col("task_type") + "::text",
		fmt.Sprintf("coalesce(%s::jsonb, '{}')", col("payload")),
		runAt,
		fmt.Sprintf("CASE %s WHEN 'completed' THEN 'done' WHEN 'failed' THEN 'dead' ELSE 'pending' END", status),
		fmt.Sprintf("least(greatest(coalesce(%s, 0), 0), 1000000)", col("attempts")),
		fmt.Sprintf("CASE WHEN %[1]s >= 1 THEN least(%[1]s, 1000000) END", col("max_attempts")),
		col("error_message") + "::text",
		fmt.Sprintf("CASE %s WHEN 'completed' THEN coalesce(%s::timestamptz, %s::timestamptz, now()) WHEN 'failed' THEN coalesce(%s::timestamptz, now()) END",
			status, col("completed_at"), col("updated_at"), col("updated_at")),
		fmt.Sprintf("coalesce(%s::timestamptz, now())", col("updated_at")),
		b.key(col("id")),
	}
	return "queue, kind, payload, run_at, status, attempts, max_attempts, last_error, finished_at, updated_at, dedup_key", strings.Join(values, ",\n        ")
}

// insertable are the columns an INSERT may set: all but generated ones.
func (b bridge) insertable() []column {
	var out []column
	for _, c := range b.cols {
		if !c.generated {
			out = append(out, c)
		}
	}
	return out
}

// updatable are the columns an UPDATE may set: all but generated ones and
// identities GENERATED ALWAYS.
func (b bridge) updatable() []column {
	var out []column
	for _, c := range b.cols {
		if !c.generated && c.identity != "a" {
			out = append(out, c)
		}
	}
	return out
}

func idents(cols []column, prefix string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = prefix + c.ident()
	}
	return strings.Join(out, ", ")
}

func (b bridge) overriding() string {
	for _, c := range b.cols {
		if c.identity == "a" {
			return " OVERRIDING SYSTEM VALUE"
		}
	}
	return ""
}

const checkStatus = `
    IF NEW.status::text NOT IN ('pending', 'processing', 'completed', 'failed') THEN
        RAISE EXCEPTION 'new row for %% has status %%: want pending, processing, completed or failed', %s, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;`

// keyTaken follows the INSERT of a row's job: a job the bridge did not
// make holding the row's key (a writer of the jobs table can take it) is
// an error, and not unique_violation, which a producer would take for its
// own row inserted before.
const keyTaken = `
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id INTO job;
    IF job IS NULL THEN
        RAISE EXCEPTION 'the key %% of the job of row %% of %% is held by another job: a writer of the jobs table took it', %s, NEW.id, %s;
    END IF;`

// switchStatements are the statements of the switch, after the table is
// locked and checked.
func (b bridge) switchStatements() []string {
	store, jobs := b.rel.store(), b.jobs()
	view := b.rel.ident()
	tableLit := literal(b.rel.name)
	var st []string
	add := func(format string, args ...any) { st = append(st, fmt.Sprintf(format, args...)) }

	add("ALTER TABLE %s RENAME TO %s", view, pgx.Identifier{b.rel.storeName()}.Sanitize())
	add("ALTER TABLE %s ADD COLUMN %s bigint", store, JobIDColumn)
	// Each row's job id, taken in the order of the rows' ids.
	add(`UPDATE %[1]s s SET %[2]s = n.job_id
FROM (SELECT o.id, nextval(pg_get_serial_sequence(%[3]s, 'id')) AS job_id
      FROM (SELECT id FROM %[1]s ORDER BY id) o) n
WHERE s.id = n.id`, store, JobIDColumn, literal(jobs))
	cols, vals := b.jobValues("s", true)
	add(`INSERT INTO %s (id, %s) OVERRIDING SYSTEM VALUE
SELECT s.%s,
        %s
FROM %s s ORDER BY s.%s`, jobs, cols, JobIDColumn, vals, store, JobIDColumn)
	add("CREATE INDEX %s ON %s (%s) WHERE status NOT IN ('completed', 'failed')",
		pgx.Identifier{b.rel.storeName() + "_unsettled"}.Sanitize(), store, JobIDColumn)

	exprs := make([]string, len(b.cols))
	for i, c := range b.cols {
		exprs[i] = b.viewExpr(c) + " AS " + c.ident()
	}
	add("CREATE VIEW %s AS\nSELECT %s\nFROM %s s LEFT JOIN %s j ON j.id = s.%s AND %s", view, strings.Join(exprs, ",\n       "), store, jobs, JobIDColumn, b.ownJob())
	for _, c := range b.cols {
		def := c.def
		if c.identity != "" {
			def = fmt.Sprintf("nextval(%s::regclass)", literal(c.sequence))
		}
		if def != "" && !c.generated {
			add("ALTER VIEW %s ALTER COLUMN %s SET DEFAULT %s", view, c.ident(), def)
		}
	}
	add("COMMENT ON VIEW %s IS %s", view, literal(marker(b.schema)))
	add("COMMENT ON COLUMN %s.%s IS %s", store, JobIDColumn, literal(b.meta.String()))

	ins := b.insertable()
	cols, vals = b.jobValues("NEW", false)
	add(`CREATE FUNCTION %[1]s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    job bigint;
BEGIN
    NEW.status := coalesce(NEW.status, 'pending');%[2]s
    -- The row first, so that its own constraints speak first (a taken id
    -- is a unique_violation, as it was in the table); then its job, made
    -- from the row as stored.
    job := nextval(%[13]s::regclass);
    INSERT INTO %[6]s (%[8]s, %[9]s)%[7]s
    VALUES (%[10]s, job)
    RETURNING %[11]s INTO NEW;
    IF NOT FOUND THEN
        RETURN NULL; -- a trigger of the store's own skipped the row
    END IF;
    INSERT INTO %[3]s (id, %[4]s) OVERRIDING SYSTEM VALUE
    VALUES (job, %[5]s)%[12]s
    RETURN NEW;
END
$body$`, b.rel.function("insert"), fmt.Sprintf(checkStatus, tableLit), jobs, cols, vals,
		store, b.overriding(), idents(ins, ""), JobIDColumn, idents(ins, "NEW."), idents(b.cols, ""),
		fmt.Sprintf(keyTaken, b.key("NEW.id"), tableLit), literal(b.jobIDs))

	changed := func(name string) string {
		c := pgx.Identifier{name}.Sanitize()
		if name == "payload" {
			return fmt.Sprintf("NEW.%s::text IS DISTINCT FROM OLD.%s::text", c, c)
		}
		return fmt.Sprintf("NEW.%s IS DISTINCT FROM OLD.%s", c, c)
	}
	var jobChange []string
	for _, n := range []string{"task_type", "payload", "status", "attempts", "max_attempts", "execute_at"} {
		jobChange = append(jobChange, changed(n))
	}
	add(`CREATE FUNCTION %[1]s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    job bigint;
    job_status text;
BEGIN
    SELECT s.%[2]s INTO job FROM %[3]s s WHERE s.id = OLD.id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;%[4]s
    -- The row's job is the one the bridge made for it; a row pointed at
    -- another reads, and is written, as if its job were gone.
    SELECT j.status INTO job_status FROM %[5]s j WHERE j.id = job AND j.dedup_key = %[20]s FOR UPDATE;
    IF job_status IS NOT NULL AND OLD.status::text IS DISTINCT FROM
       (CASE job_status WHEN 'pending' THEN 'pending' WHEN 'running' THEN 'processing' WHEN 'done' THEN 'completed' ELSE 'failed' END) THEN
        -- The job moved on after the statement read the row (a worker
        -- finished or retried it): what the statement chose the row by
        -- may hold no more, so the row is left alone.
        RETURN NULL;
    ELSIF job_status = 'running' THEN
        -- pgdispatch is running the job: its state is pgdispatch's until
        -- the attempt ends, and only the other columns may change.
        IF %[6]s THEN
            RETURN NULL;
        END IF;
    ELSIF NEW.status = 'processing' AND OLD.status IS DISTINCT FROM 'processing' THEN
        -- An AT Worker claiming the row: pgdispatch runs it.
        RETURN NULL;
    ELSIF job_status IS NULL THEN
        -- The job was purged; a row made pending again is a new job.
        IF NEW.status = 'pending' AND %[7]s THEN
            INSERT INTO %[5]s (%[8]s)
            VALUES (%[9]s)%[24]s
        END IF;
    ELSE
        UPDATE %[5]s j SET
            kind = CASE WHEN %[10]s THEN NEW.task_type::text ELSE j.kind END,
            payload = CASE WHEN %[11]s THEN coalesce(NEW.payload::jsonb, '{}') ELSE j.payload END,
            attempts = CASE WHEN %[12]s THEN least(greatest(coalesce(NEW.attempts, 0), 0), 1000000) ELSE j.attempts END,
            max_attempts = CASE WHEN %[13]s THEN CASE WHEN NEW.max_attempts >= 1 THEN least(NEW.max_attempts, 1000000) END ELSE j.max_attempts END,
            status = CASE WHEN %[14]s THEN CASE NEW.status::text WHEN 'completed' THEN 'done' WHEN 'failed' THEN 'dead' ELSE 'pending' END
                          ELSE j.status END,
            run_at = CASE WHEN %[15]s THEN coalesce(NEW.execute_at::timestamptz, now())
                          WHEN %[14]s AND NEW.status = 'pending' THEN now()
                          ELSE j.run_at END,
            last_error = CASE WHEN %[16]s THEN NEW.error_message::text ELSE j.last_error END,
            finished_at = CASE WHEN NOT (%[14]s) THEN j.finished_at
                               WHEN NEW.status = 'completed' THEN coalesce(NEW.completed_at::timestamptz, now())
                               WHEN NEW.status = 'failed' THEN now() END,
            updated_at = CASE WHEN %[21]s THEN coalesce(NEW.updated_at::timestamptz, now())
                              WHEN %[22]s THEN now()
                              ELSE j.updated_at END
        WHERE j.id = job;
    END IF;
    IF job_status IS NOT NULL AND NEW.id IS DISTINCT FROM OLD.id THEN
        UPDATE %[5]s j SET dedup_key = %[23]s WHERE j.id = job;
    END IF;
    UPDATE %[3]s s SET (%[17]s, %[2]s) = ROW(%[18]s, job)
    WHERE s.id = OLD.id
    RETURNING %[19]s INTO NEW;
    RETURN NEW;
END
$body$`, b.rel.function("update"), JobIDColumn, store, fmt.Sprintf(checkStatus, tableLit), jobs,
		strings.Join(jobChange, " OR "), changed("status"), cols, vals,
		changed("task_type"), changed("payload"), changed("attempts"), changed("max_attempts"), changed("status"),
		changed("execute_at"), changed("error_message"),
		idents(b.updatable(), ""), idents(b.updatable(), "NEW."), idents(b.cols, "s."),
		b.key("OLD.id"), changed("updated_at"), strings.Join(append(jobChange, changed("error_message")), " OR "), b.key("NEW.id"),
		strings.ReplaceAll(fmt.Sprintf(keyTaken, b.key("NEW.id"), tableLit), "\n    ", "\n            "))

	add(`CREATE FUNCTION %[1]s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    job bigint;
BEGIN
    SELECT s.%[2]s INTO job FROM %[3]s s WHERE s.id = OLD.id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    DELETE FROM %[4]s j WHERE j.id = job AND j.dedup_key = %[5]s;
    DELETE FROM %[3]s s WHERE s.id = OLD.id;
    RETURN OLD;
END
$body$`, b.rel.function("delete"), JobIDColumn, store, jobs, b.key("OLD.id"))
	for i, sql := range st {
		st[i] = dollarQuote(sql)
	}
	for _, op := range []string{"insert", "update", "delete"} {
		add("CREATE TRIGGER %s INSTEAD OF %s ON %s FOR EACH ROW EXECUTE FUNCTION %s()",
			pgx.Identifier{b.rel.storeName() + "_" + op}.Sanitize(), strings.ToUpper(op), view, b.rel.function(op))
	}
	return st
}

// dollarQuote gives a function's body, quoted with $body$, a tag that no
// name in it holds: a column or table may be named "x$body$".
func dollarQuote(sql string) string {
	const tag = "$body$"
	if !strings.HasPrefix(sql, "CREATE FUNCTION") || strings.Count(sql, tag) == 2 {
		return sql
	}
	open, end := strings.Index(sql, tag), strings.LastIndex(sql, tag)
	body := sql[open+len(tag) : end]
	n := 0
	for strings.Contains(body, fmt.Sprintf("$body%d$", n)) {
		n++
	}
	unique := fmt.Sprintf("$body%d$", n)
	return sql[:open] + unique + body + unique + sql[end+len(tag):]
}

// settleSQL writes the final state of finished jobs into their store rows
// not yet settled, at most $1 rows, locked in id order.
func (b bridge) settleSQL() string {
	return fmt.Sprintf(`
WITH t AS (
    SELECT s.id FROM %[1]s s JOIN %[2]s j ON j.id = s.%[3]s AND %[5]s
    WHERE s.status NOT IN ('completed', 'failed') AND j.status IN ('done', 'dead', 'cancelled')
    ORDER BY s.id
    LIMIT $1
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE %[1]s s SET %[4]s
FROM %[2]s j
WHERE s.id IN (SELECT id FROM t) AND j.id = s.%[3]s AND %[5]s`, b.rel.store(), b.jobs(), JobIDColumn, b.settleSet(""), b.ownJob())
}

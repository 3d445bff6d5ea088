// Package atworker puts pgdispatch in the AT Worker's place without
// changing its producers or its operators' SQL.
//
// The AT Worker ran the rows of a table, scheduled_tasks. Switch turns that
// table into a bridge, in one transaction:
//
//   - the table is renamed to its store, scheduled_tasks_at_worker, which
//     keeps every row, column, index, constraint and the id sequence, and
//     gains a column pgdispatch_job_id;
//   - every row becomes a job of pgdispatch.jobs, with the row's updated_at
//     and a dedup_key unique to the switch and the row (meta): pending rows
//     are pending jobs due at execute_at; rows an AT Worker was processing
//     are pending jobs due once its stuck timeout has passed since their
//     updated_at, so that an AT Worker still running can finish them first
//     (its UPDATE marks the job done or dead, and it never runs); completed
//     rows are done jobs and failed rows dead ones;
//   - a view named scheduled_tasks, with the table's columns in their order
//     and types, reads each row's state from its job (status under the AT
//     Worker's names), and from the store once the job is purged, or while
//     the store holds the row's final state and the job has not changed
//     since. The view, its triggers, Settle and Revert take a row's job to
//     be the job pgdispatch_job_id names only when its dedup_key is the
//     row's;
//   - the table's grants move to the view: the store is its owner's alone,
//     so that no role can point a row at another job;
//   - INSTEAD OF triggers on the view make an INSERT a job and a store row,
//     in the producer's transaction; an UPDATE reaches the job as far as it
//     makes sense (an AT Worker finishing a task it held, an operator
//     retrying a failed row), and a DELETE deletes both.
//
// Nothing is added to the jobs table: jobs that do not come from
// scheduled_tasks pay nothing. Settle writes the final state of finished
// jobs back into the store, so that the view still answers once the sweeper
// has purged them; every pgdispatch.Worker runs a Settler, which calls it
// every SWEEP_INTERVAL.
//
// Revert makes scheduled_tasks a table again, with every row's current
// state, and cancels the pending jobs, which the AT Worker runs from then on.
package atworker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Defaults of Options.
const (
	DefaultTable        = "scheduled_tasks"
	DefaultQueue        = "default"
	DefaultStuckTimeout = 5 * time.Minute // the AT Worker's WORKER_STUCK_TIMEOUT
	DefaultLockWait     = 5 * time.Second
	DefaultRevertWait   = time.Minute
)

// StoreSuffix names the store: the table's name with it appended.
const StoreSuffix = "_at_worker"

// JobIDColumn is the store's column that holds each row's job.
const JobIDColumn = "pgdispatch_job_id"

// meta is what Settle and Revert need to know of a switch, kept as JSON
// in the comment on the store's JobIDColumn.
type meta struct {
	// KeyPrefix begins the dedup_key of every job the bridge makes; the
	// row's id ends it. It is unique to the switch, so that a switch made
	// after a revert makes new keys while the old jobs are kept.
	KeyPrefix string `json:"dedup_key_prefix"`
	// StuckTimeout is how long after its updated_at a row that was
	// processing at the switch became due, in seconds.
	StuckTimeout float64 `json:"stuck_timeout_seconds"`
}

var keyPrefix = regexp.MustCompile(`^at-worker:[0-9a-f]{16}:$`)

func newMeta(stuck time.Duration) meta {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return meta{KeyPrefix: "at-worker:" + hex.EncodeToString(b) + ":", StuckTimeout: stuck.Seconds()}
}

func parseMeta(comment string) (meta, error) {
	var m meta
	if err := json.Unmarshal([]byte(comment), &m); err != nil || !keyPrefix.MatchString(m.KeyPrefix) || !(m.StuckTimeout > 0) {
		return m, fmt.Errorf("the comment on its column %s is not the switch's (%q)", JobIDColumn, comment)
	}
	return m, nil
}

func (m meta) String() string {
	b, _ := json.Marshal(m)
	return string(b)
}

// grace is StuckTimeout as an SQL interval.
func (m meta) grace() string {
	return "make_interval(secs => " + strconv.FormatFloat(m.StuckTimeout, 'g', -1, 64) + ")"
}

// The AT Worker's statuses.
const (
	Pending    = "pending"
	Processing = "processing"
	Completed  = "completed"
	Failed     = "failed"
)

// RowCounts counts a table's rows by status.
type RowCounts map[string]int64

// String writes the counts as "3 rows (1 pending, 2 completed)": the AT
// Worker's statuses in their order, then any others by name, as they are.
func (c RowCounts) String() string {
	known := []string{Pending, Processing, Completed, Failed}
	var total int64
	var parts, others []string
	for _, s := range known {
		if n := c[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	for s, n := range c {
		if total += n; !slices.Contains(known, s) {
			others = append(others, fmt.Sprintf("%d %s", n, s))
		}
	}
	slices.Sort(others)
	if parts = append(parts, others...); len(parts) == 0 {
		return "0 rows"
	}
	return fmt.Sprintf("%d rows (%s)", total, strings.Join(parts, ", "))
}

// contract is the columns of the AT Worker's table that its README's
// queries use. Every other column is the application's and is kept as is.
var contract = []string{
	"id", "task_type", "payload", "status", "attempts", "max_attempts",
	"execute_at", "updated_at", "completed_at", "error_message",
}

// ErrNoTable is returned when the table does not exist.
var ErrNoTable = errors.New("no such table")

// ErrLocked is returned when the table's lock was not granted within the
// lock wait. Nothing changed.
var ErrLocked = errors.New("the table is locked by another session")

// DB is what the functions need of a pool or a connection.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Options say which table to switch or revert, and how.
type Options struct {
	// Schema is pgdispatch's schema. Required.
	Schema string
	// Table is the AT Worker's table, as SQL reads it: scheduled_tasks
	// (found on the search_path) or app.scheduled_tasks. Default:
	// DefaultTable.
	Table string
	// Queue is the queue of the jobs made from the table's rows. Default:
	// DefaultQueue.
	Queue string
	// StuckTimeout is the AT Worker's WORKER_STUCK_TIMEOUT: a row it was
	// processing at the switch is due that long after its updated_at.
	// Default: DefaultStuckTimeout.
	StuckTimeout time.Duration
	// LockWait bounds the wait for the table's lock; producers queue behind
	// the wait, so keep it short. Default: DefaultLockWait.
	LockWait time.Duration
	// DryRun reports what would be done, and changes nothing.
	DryRun bool
}

func (o *Options) fill() error {
	if o.Schema == "" {
		return errors.New("atworker: Schema is required")
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.Queue == "" {
		o.Queue = DefaultQueue
	}
	if o.StuckTimeout <= 0 {
		o.StuckTimeout = DefaultStuckTimeout
	}
	if o.LockWait <= 0 {
		o.LockWait = DefaultLockWait
	}
	return nil
}

// Plan is what Switch did, or would do with DryRun.
type Plan struct {
	Table string // the view, schema-qualified and quoted
	Store string // the table's new name, schema-qualified and quoted
	// AlreadySwitched is set when Table is already the bridge: nothing
	// was done.
	AlreadySwitched bool
	// Rows counts the table's rows by status, as the jobs they become.
	Rows RowCounts
	// Columns are the application's own columns, kept in the store and
	// shown by the view.
	Columns []string
	// Statements are the SQL statements, in order.
	Statements []string
}

// relation is the table or view Options.Table names.
type relation struct {
	oid          uint32
	kind         string // pg_class.relkind
	schema, name string
	comment      string
}

func (r relation) ident() string { return pgx.Identifier{r.schema, r.name}.Sanitize() }

func (r relation) storeName() string { return r.name + StoreSuffix }

func (r relation) store() string { return pgx.Identifier{r.schema, r.storeName()}.Sanitize() }

// function is the name of one of the bridge's functions.
func (r relation) function(what string) string {
	return pgx.Identifier{r.schema, r.storeName() + "_" + what}.Sanitize()
}

// marker is the comment on a bridge's view: the keeper finds bridges by it.
func marker(schema string) string {
	return "pgdispatch at-worker bridge: jobs in " + pgx.Identifier{schema}.Sanitize()
}

const findSQL = `
SELECT c.oid, c.relkind::text, n.nspname, c.relname, coalesce(obj_description(c.oid, 'pg_class'), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`

func find(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string,
) (relation, error) {
	var r relation
	err := q.QueryRow(ctx, findSQL, table).Scan(&r.oid, &r.kind, &r.schema, &r.name, &r.comment)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: %s", ErrNoTable, table)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42602" || pgErr.Code == "42601") { // invalid_name, syntax_error
		return r, fmt.Errorf("%w: %s (%s)", ErrNoTable, table, pgErr.Message)
	}
	return r, err
}

// column is one of the table's columns.
type column struct {
	name      string
	typ       string // format_type: the type as SQL writes it
	def       string // the default expression, or ""
	identity  string // pg_attribute.attidentity: "a", "d" or ""
	generated bool
	sequence  string // an identity column's sequence, as a qualified name
}

func (c column) ident() string { return pgx.Identifier{c.name}.Sanitize() }

const columnsSQL = `
SELECT a.attname, format_type(a.atttypid, a.atttypmod), coalesce(pg_get_expr(d.adbin, d.adrelid), ''),
       a.attidentity::text, a.attgenerated <> '', coalesce(pg_get_serial_sequence($2, a.attname), '')
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

func columns(ctx context.Context, tx pgx.Tx, r relation) ([]column, error) {
	rows, err := tx.Query(ctx, columnsSQL, r.oid, r.ident())
	if err != nil {
		return nil, err
	}
	var (
		cols []column
		c    column
	)
	_, err = pgx.ForEachRow(rows, []any{&c.name, &c.typ, &c.def, &c.identity, &c.generated, &c.sequence}, func() error {
		if c.identity == "\x00" {
			c.identity = ""
		}
		cols = append(cols, c)
		return nil
	})
	return cols, err
}

// textTypes are the types the status column may have: the view compares
// and casts it as text.
var textTypes = map[string]bool{"text": true, "character varying": true, "character": true}

// checkColumns checks that cols hold the contract, with types the bridge
// can read and write.
func checkColumns(r relation, cols []column) (map[string]column, error) {
	byName := map[string]column{}
	for _, c := range cols {
		byName[c.name] = c
	}
	var missing, problems []string
	for _, name := range contract {
		c, ok := byName[name]
		switch {
		case !ok:
			missing = append(missing, name)
		case c.generated:
			problems = append(problems, name+" is a generated column")
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s is not the AT Worker's table: it lacks the column(s) %s", r.ident(), strings.Join(missing, ", "))
	}
	if _, ok := byName[JobIDColumn]; ok {
		problems = append(problems, "it has a column named "+JobIDColumn+" already")
	}
	for _, name := range []string{"status", "task_type"} {
		if c := byName[name]; !textTypes[strings.SplitN(c.typ, "(", 2)[0]] {
			problems = append(problems, fmt.Sprintf("%s is of type %s, not text or varchar", name, c.typ))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("cannot switch %s: %s", r.ident(), strings.Join(problems, "; "))
	}
	return byName, nil
}

// literal quotes s as an SQL string literal (standard_conforming_strings
// is on in every supported PostgreSQL unless turned off).
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func jobsTable(schema string) string { return pgx.Identifier{schema, "jobs"}.Sanitize() }

// setLockTimeout bounds the lock waits of tx's statements.
func setLockTimeout(ctx context.Context, tx pgx.Tx, wait time.Duration) error {
	_, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", max(wait.Milliseconds(), 1)))
	return err
}

// lock takes the table's lock, or returns ErrLocked after the wait.
func lock(ctx context.Context, tx pgx.Tx, rels ...string) error {
	_, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(rels, ", ")+" IN ACCESS EXCLUSIVE MODE")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return ErrLocked
	}
	return err
}

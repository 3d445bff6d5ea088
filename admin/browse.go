package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/internal/redact"
)

// Sorts are the orders Page lists jobs in. Each is backed by an index: id
// by the primary key, run_at (pending jobs) by jobs_claim_idx (of a kind,
// jobs_kind_idx) and finished_at (finished jobs) by jobs_finished_idx.
var Sorts = []string{"id", "run_at", "finished_at"}

// TimeFields are the columns a JobFilter's time range may bound.
var TimeFields = []string{"created_at", "run_at", "finished_at"}

// JobFilter selects and orders jobs for a page of a browser. Empty fields
// select everything.
type JobFilter struct {
	Statuses []string
	Queue    string
	Kind     string
	// ID selects one job.
	ID int64
	// MaxID, when not 0, selects jobs with ids up to it: those that
	// existed when a count was shown.
	MaxID int64
	// ErrorText selects jobs whose last_error holds it, without regard to
	// case.
	ErrorText string
	// TimeField (one of TimeFields; default created_at) is bounded by Since
	// (inclusive) and Until (exclusive); a zero time leaves a side open.
	TimeField    string
	Since, Until time.Time
	// Sort is one of Sorts (default id), newest or latest first unless Asc.
	// Sorting by run_at lists pending jobs only, and by finished_at
	// finished jobs only.
	Sort string
	Asc  bool
	// After continues from a Cursor that an earlier Page returned.
	After *Cursor
	// Limit is the most jobs a page holds. Default: DefaultLimit.
	Limit int
}

// Cursor is where a page ended: the sort column's value and the id of its
// last job.
type Cursor struct {
	Time time.Time
	ID   int64
}

// String writes c for a URL: the sort value in Unix microseconds, a dot and
// the id.
func (c Cursor) String() string {
	if c.Time.IsZero() {
		return strconv.FormatInt(c.ID, 10)
	}
	return strconv.FormatInt(c.Time.UnixMicro(), 10) + "." + strconv.FormatInt(c.ID, 10)
}

// ParseCursor reads what Cursor.String wrote.
func ParseCursor(s string) (*Cursor, error) {
	if s == "" {
		return nil, nil
	}
	t, id, hasTime := strings.Cut(s, ".")
	if !hasTime {
		id, t = t, ""
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("cursor %q: not one a page returned", s)
	}
	c := &Cursor{ID: n}
	if t != "" {
		us, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cursor %q: not one a page returned", s)
		}
		c.Time = time.UnixMicro(us).UTC()
	}
	return c, nil
}

// where builds the filter's conditions from constant fragments, numbering
// the arguments; nothing of f is formatted into the SQL.
func (f JobFilter) where() (string, []any, error) {
	for _, s := range f.Statuses {
		if !slices.Contains(Statuses, s) {
			return "", nil, fmt.Errorf("unknown status %q: want one of %s", s, strings.Join(Statuses, ", "))
		}
	}
	timeField := cmp.Or(f.TimeField, "created_at")
	if !slices.Contains(TimeFields, timeField) {
		return "", nil, fmt.Errorf("unknown time field %q: want one of %s", f.TimeField, strings.Join(TimeFields, ", "))
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return "", nil, errors.New("the start of the time range must be before its end")
	}
	var (
		conds []string
		args  []any
	)
	add := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(args))))
	}
	switch len(f.Statuses) {
	case 0:
	case 1: // an equality, which the partial indexes and jobs_finished_idx serve
		add("status = $?", f.Statuses[0])
	default:
		add("status = ANY($?)", f.Statuses)
	}
	if f.Queue != "" {
		add("queue = $?", f.Queue)
	}
	if f.Kind != "" {
		add("kind = $?", f.Kind)
	}
	if f.ID != 0 {
		add("id = $?", f.ID)
	}
	if f.MaxID != 0 {
		add("id <= $?", f.MaxID)
	}
	if f.ErrorText != "" {
		add(`last_error ILIKE $? ESCAPE '\'`, "%"+likeEscaper.Replace(f.ErrorText)+"%")
	}
	// The column is one of TimeFields, checked above.
	if !f.Since.IsZero() {
		add(timeField+" >= $?", f.Since)
	}
	if !f.Until.IsZero() {
		add(timeField+" < $?", f.Until)
	}
	if len(conds) == 0 {
		return "true", nil, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// pageColumns are jobColumns without the ones a page of jobs does not
// show, errors and result (NULL in their place), which a writer may fill
// with up to a page's worth of bytes a row. The payload stays: a job's
// endpoint and the secrets that mask its last_error are read from it.
const pageColumns = `id, queue, kind, payload, priority, run_at, status, attempts, max_attempts, dedup_key, flow_key,
       last_error, locked_by, locked_until, created_at, updated_at, finished_at, NULL::jsonb AS errors, NULL::jsonb AS result`

// Page returns a page of the jobs f selects, in f's order, and the cursor
// of the next page (nil on the last). Its jobs have no Errors nor Result
// (pageColumns): Get has them. Keyset pagination: each page is read
// from the sort's index where the previous one ended. Sorting by run_at
// lists pending jobs (jobs_claim_idx, a queue and priority at a time,
// merged; of a kind, jobs_kind_idx, a queue at a time, merged); by
// finished_at, finished jobs, one branch per status (jobs_finished_idx),
// merged.
func (a *Admin) Page(ctx context.Context, f JobFilter) ([]Job, *Cursor, error) {
	stmt, args, err := f.page()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, err := a.pool.Query(ctx, a.sql(stmt), args...)
	if err != nil {
		return nil, nil, fmt.Errorf("list jobs: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, scanJob)
	if err != nil {
		return nil, nil, fmt.Errorf("list jobs: %w", err)
	}
	limit := cmp.Or(f.Limit, DefaultLimit)
	if len(jobs) <= limit {
		return jobs, nil, nil
	}
	jobs = jobs[:limit]
	last := jobs[limit-1]
	next := &Cursor{ID: last.ID}
	switch f.Sort {
	case "run_at":
		next.Time = last.RunAt
	case "finished_at":
		next.Time = *last.FinishedAt
	}
	return jobs, next, nil
}

// page is the statement of a page of the jobs f selects, and its
// arguments.
func (f JobFilter) page() (string, []any, error) {
	sort := cmp.Or(f.Sort, "id")
	if !slices.Contains(Sorts, sort) {
		return "", nil, fmt.Errorf("unknown sort %q: want one of %s", f.Sort, strings.Join(Sorts, ", "))
	}
	// The statuses the sort lists, each a branch of its own.
	branches := f.listed()
	if branches != nil {
		f.Statuses = nil
	}
	where, args, err := f.where()
	if err != nil {
		return "", nil, err
	}
	dir, cmpOp := " DESC", "<"
	if f.Asc {
		dir, cmpOp = "", ">"
	}
	// sort, dir and cmpOp are constants chosen above.
	order := "id" + dir
	if sort != "id" {
		order = sort + dir + ", id" + dir
		where += " AND " + sort + " IS NOT NULL" // the predicate of jobs_finished_idx
	}
	if f.After != nil {
		if sort == "id" {
			args = append(args, f.After.ID)
			where += " AND id " + cmpOp + " $" + strconv.Itoa(len(args))
		} else {
			args = append(args, f.After.Time, f.After.ID)
			where += fmt.Sprintf(" AND (%s, id) %s ($%d, $%d)", sort, cmpOp, len(args)-1, len(args))
		}
	}
	limit := cmp.Or(f.Limit, DefaultLimit)
	args = append(args, limit+1)
	limitArg := " LIMIT $" + strconv.Itoa(len(args))
	stmt := `SELECT ` + pageColumns + ` FROM {jobs} WHERE ` + where + ` ORDER BY ` + order + limitArg
	if sort == "run_at" && len(branches) == 1 {
		stmt, args := f.pendingByRunAt(where, order, limitArg, args)
		return stmt, args, nil
	}
	if branches != nil {
		// Each branch reads its status's index in order; the merge sorts
		// at most limit+1 rows of each.
		parts := make([]string, 0, len(branches))
		for _, st := range branches {
			// A literal of this package's, not input: a partial index
			// serves a generic plan only when the query repeats its
			// predicate.
			parts = append(parts, `(SELECT `+pageColumns+` FROM {jobs} WHERE `+where+` AND status = '`+st+`'`+
				` ORDER BY `+order+limitArg+`)`)
		}
		if len(parts) == 0 {
			parts = []string{`(SELECT ` + pageColumns + ` FROM {jobs} WHERE false)`}
		}
		stmt = `SELECT * FROM (` + strings.Join(parts, " UNION ALL ") + `) b ORDER BY ` + order + limitArg
	}
	return stmt, args, nil
}

// pendingByRunAt is the statement of a page of pending jobs by run_at, and
// its arguments. No index has run_at first: jobs_claim_idx (queue,
// priority, run_at, id) holds pending jobs in this order within a queue
// and a priority, a lane, and jobs_kind_idx (kind, queue, run_at, id)
// within a kind and a queue. where, order and limit are the page's, and
// args its arguments.
func (f JobFilter) pendingByRunAt(where, order, limit string, args []any) (string, []any) {
	timeField := cmp.Or(f.TimeField, "created_at")
	switch {
	case f.Kind != "" && f.Queue != "":
		// One range of jobs_kind_idx, read in order.
		return `SELECT ` + pageColumns + ` FROM {jobs} WHERE ` + where + ` AND status = 'pending' ORDER BY ` + order + limit, args
	case f.Kind != "":
		// A skip scan finds the kind's queues in jobs_kind_idx, an index
		// probe each; a page of each queue is read from it where the
		// cursor points; the merge sorts at most limit rows of each. A
		// condition the index does not check reads at most the kind's
		// pending jobs.
		args = append(args, f.Kind)
		kind := "$" + strconv.Itoa(len(args))
		return `WITH RECURSIVE lanes(queue) AS (
		    (SELECT queue FROM {jobs} WHERE kind = ` + kind + ` AND status = 'pending' ORDER BY queue LIMIT 1)
		    UNION ALL
		    SELECT n.queue FROM lanes CROSS JOIN LATERAL (
		        SELECT queue FROM {jobs}
		        WHERE kind = ` + kind + ` AND status = 'pending' AND queue > lanes.queue
		        ORDER BY queue LIMIT 1
		    ) n
		)
		SELECT p.* FROM lanes CROSS JOIN LATERAL (
		    SELECT ` + pageColumns + ` FROM {jobs}
		    WHERE queue = lanes.queue AND ` + where + ` AND status = 'pending'
		    ORDER BY ` + order + limit + `
		) p ORDER BY ` + order + limit, args
	case f.ErrorText != "" || f.ID != 0 || (timeField != "run_at" && (!f.Since.IsZero() || !f.Until.IsZero())):
		// A condition jobs_claim_idx does not check would have a lane that
		// lacks it read to its end, in the index's order: every pending
		// job is read once instead, in the table's order (a bitmap scan),
		// and the page is the first of their ids sorted.
		return `SELECT ` + pageColumns + ` FROM {jobs} WHERE id = ANY(ARRAY(
		    SELECT id FROM {jobs} WHERE ` + where + ` AND status = 'pending' ORDER BY ` + order + limit + `
		)) ORDER BY ` + order, args
	}
	// A skip scan finds the lanes, an index probe each; a page of each
	// lane is read from the index where the cursor points; the merge sorts
	// at most limit rows of each lane.
	return `WITH RECURSIVE lanes(queue, priority) AS (
	    (SELECT queue, priority FROM {jobs} WHERE status = 'pending' ORDER BY queue, priority LIMIT 1)
	    UNION ALL
	    SELECT n.queue, n.priority FROM lanes CROSS JOIN LATERAL (
	        SELECT queue, priority FROM {jobs}
	        WHERE status = 'pending' AND (queue, priority) > (lanes.queue, lanes.priority)
	        ORDER BY queue, priority LIMIT 1
	    ) n
	)
	SELECT p.* FROM lanes CROSS JOIN LATERAL (
	    SELECT ` + pageColumns + ` FROM {jobs}
	    WHERE queue = lanes.queue AND priority = lanes.priority AND ` + where + ` AND status = 'pending'
	    ORDER BY ` + order + limit + `
	) p ORDER BY ` + order + limit, args
}

// listed is the statuses f's sort lists, within f.Statuses if it names
// any: pending jobs by run_at, finished ones by finished_at; nil for a sort
// by id, which lists every status.
func (f JobFilter) listed() []string {
	var listed []string
	switch f.Sort {
	case "run_at":
		listed = []string{"pending"}
	case "finished_at":
		listed = []string{"done", "dead", "cancelled"}
	default:
		return nil
	}
	if len(f.Statuses) > 0 {
		listed = slices.DeleteFunc(listed, func(s string) bool { return !slices.Contains(f.Statuses, s) })
	}
	return listed
}

// matching is the condition of the jobs f selects as its pages list them:
// its statuses within those its sort lists, its order and cursor aside.
func (f JobFilter) matching() (string, []any, error) {
	if !slices.Contains(Sorts, cmp.Or(f.Sort, "id")) {
		return "", nil, fmt.Errorf("unknown sort %q: want one of %s", f.Sort, strings.Join(Sorts, ", "))
	}
	where, args, err := f.where()
	if listed := f.listed(); err == nil && listed != nil {
		if len(listed) == 0 {
			return "false", nil, nil
		}
		f.Statuses = listed
		where, args, err = f.where()
	}
	return where, args, err
}

// Count counts the jobs f selects, as its pages list them (its statuses
// within those its sort lists; its cursor aside), and returns the highest
// id among them (0 for none): the bound of an action on what was counted.
func (a *Admin) Count(ctx context.Context, f JobFilter) (n, maxID int64, err error) {
	where, args, err := f.matching()
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if err := a.pool.QueryRow(ctx, a.sql(`SELECT count(*), coalesce(max(id), 0) FROM {jobs} WHERE `+where), args...).Scan(&n, &maxID); err != nil {
		return 0, 0, fmt.Errorf("count jobs: %w", err)
	}
	return n, maxID, nil
}

// EachMatching calls fn with the ids of the jobs f selects, as its pages
// list them (its statuses within those its sort lists), BatchSize at a
// time in id order, read page by page through the primary key: for an
// action on everything a filter selects. f's order and cursor are ignored.
// Jobs that start to match while it runs may be left out; f.MaxID keeps
// out those made after a count.
func (a *Admin) EachMatching(ctx context.Context, f JobFilter, fn func(ids []int64) error) error {
	where, args, err := f.matching()
	if err != nil {
		return err
	}
	after := int64(0)
	args = append(args, after)
	stmt := a.sql(`SELECT id FROM {jobs} WHERE ` + where + ` AND id > $` + strconv.Itoa(len(args)) +
		` ORDER BY id LIMIT ` + strconv.Itoa(BatchSize))
	for {
		args[len(args)-1] = after
		qctx, cancel := context.WithTimeout(ctx, a.timeout)
		rows, _ := a.pool.Query(qctx, stmt, args...)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		cancel()
		if err != nil {
			return fmt.Errorf("select jobs: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		if err := fn(ids); err != nil {
			return err
		}
		if len(ids) < BatchSize {
			return nil
		}
		after = ids[len(ids)-1]
	}
}

// Delete deletes the jobs among ids that are not running (a running job is
// cancelled first), with their rows locked in id order, and reports each id.
func (a *Admin) Delete(ctx context.Context, ids []int64) ([]Change, error) {
	return a.change(ctx, ids, "delete", `WITH l AS (
	    SELECT id, status FROM {jobs} WHERE id = ANY($1) ORDER BY id FOR UPDATE
	), d AS (
	    DELETE FROM {jobs} j USING l WHERE j.id = l.id AND l.status <> 'running' RETURNING j.id
	)
	SELECT l.id, l.status, d.id IS NOT NULL FROM l LEFT JOIN d ON d.id = l.id ORDER BY l.id`)
}

// Mask masks the secrets of j's payload, last_error, errors and result, as
// `jobs show` does without --reveal (see redact.Payload), and reports
// whether it masked anything.
//
// The workers mask receivers' replies as they write them; a row written
// before they did, or by another writer, may still quote a secret of its
// own payload (as written, or in base64 as AUTH PLAIN sends it), so the
// payload's secrets are masked wherever they appear in the job.
func (j *Job) Mask() bool {
	before := *j
	known := redact.NewSecrets(redact.PayloadSecrets(j.Payload)...)
	if j.LastError != nil {
		masked := redact.URLs(redact.Reply(*j.LastError, known))
		j.LastError = &masked
	}
	j.Payload = MaskJSON(j.Payload)
	j.Errors = MaskJSON(maskKnown(j.Errors, known))
	j.Result = MaskJSON(maskKnown(j.Result, known))
	return string(before.Payload) != string(j.Payload) || *ptrOr(before.LastError) != *ptrOr(j.LastError) ||
		string(before.Errors) != string(j.Errors) || string(before.Result) != string(j.Result)
}

// maskKnown masks known secrets in a JSON document's text, and keeps the
// document as it was if that would leave it invalid.
func maskKnown(raw []byte, known *redact.Secrets) []byte {
	if len(raw) == 0 {
		return raw
	}
	if masked := []byte(known.Mask(string(raw))); json.Valid(masked) {
		return masked
	}
	return raw
}

func ptrOr(s *string) *string {
	if s == nil {
		return new(string)
	}
	return s
}

// MaskJSON masks the secrets of a JSON document (see redact.Payload), or
// the whole of it when it does not parse.
func MaskJSON(raw []byte) []byte {
	if len(raw) == 0 {
		return raw
	}
	p, err := redact.Payload(raw)
	if err != nil {
		return []byte(`"` + redact.Mask + `"`)
	}
	return p
}

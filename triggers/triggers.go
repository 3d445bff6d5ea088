// Package triggers holds the contract between the database triggers that
// announce work and the listener that hears them, and the dispatch triggers
// that turn row changes in the application's own tables into jobs.
//
// The jobs table's triggers (created by package migrations) send
// pg_notify(channel, queue) when a job becomes pending while a worker of its
// queue sleeps. migrations/schema.sql shows them as they are today, in one
// place: jobs_notify_insert and jobs_notify_update, whose WHEN tries the
// queue's sleep key, and the function notify_sleeper they call. The channel is the schema's name, so two pgdispatch schemas
// in one database never hear each other. The payload is only the queue name.
//
// Add attaches a dispatch trigger to any table: each inserted, updated or
// deleted row becomes a job in the writer's own transaction, so a write that
// rolls back creates no job. The job's payload is the one given with an
// event envelope merged in: under "data" for http_callback (the POSTed body),
// "body" for rabbitmq, and "event" for every other kind:
//
//	{"event_id": "…uuid…", "trigger": "orders_paid", "op": "UPDATE",
//	 "schema": "public", "table": "orders", "at": "…",
//	 "new": {…the row…}, "old": {…the row before, for UPDATE and DELETE…}}
//
// A trigger may give its jobs a flow key from a column of the row
// (Spec.FlowKey), to which the flow limits of the jobs' queue apply.
//
// The SQL functions add_trigger and remove_trigger (migration 004) do the
// work, so psql users have the same API. Add calls add_trigger in a
// transaction and checks the trigger it created against its record before
// committing (verify.go): a WHEN condition cannot give the trigger other
// arguments, events or a condition than the ones recorded.
package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Channel is the NOTIFY channel of the pgdispatch installation in schema.
func Channel(schema string) string { return schema }

// ControlChannel is the channel on which pgdispatch's SQL functions tell
// workers what an operator did, for every schema: the payload is a JSON
// object naming the schema (see Control). Its name cannot be a schema's
// channel cut short, as a schema name of 63 bytes and a suffix would be.
const ControlChannel = "pgdispatch.control"

// Control is a message on ControlChannel: cancel() sends the ids of the
// running jobs it cancelled, at most 300 a message, a change to the
// schedules table sends schedules: true, and rotate_signing_secret()
// sends secrets: true.
type Control struct {
	Schema    string  `json:"schema"`
	Cancel    []int64 `json:"cancel,omitempty"`
	Schedules bool    `json:"schedules,omitempty"`
	Secrets   bool    `json:"secrets,omitempty"`
	Endpoints bool    `json:"endpoints,omitempty"`
}

// DefaultLockWait bounds how long Add and Remove wait for the table's lock.
const DefaultLockWait = time.Second

// ErrLocked is returned when the table stayed locked by another session for
// longer than the lock wait. Nothing was changed, and the table's writers did
// not queue behind the attempt for longer than the wait.
var ErrLocked = errors.New("the table is locked by another session")

// ErrNotFound is returned by Remove for a name no dispatch trigger has.
var ErrNotFound = errors.New("no such pgdispatch trigger")

// DB is what the functions need of a pool, a connection or a transaction.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Spec describes a dispatch trigger.
type Spec struct {
	// Table is the table, as SQL reads it: public.orders, or
	// public."Odd ""name""". Required.
	Table string
	// Events are some of insert, update and delete. Default: insert.
	Events []string
	// Kind is the jobs' kind. Required.
	Kind string
	// Payload is the jobs' payload, a JSON object, before the event is
	// merged in. Default: {}.
	Payload json.RawMessage
	// Queue is the jobs' queue. Default: "default".
	Queue string
	// When is a trigger WHEN condition over NEW and OLD, such as
	// NEW.status = 'paid'. It may not contain ';' or comments. Default: every
	// row.
	When string
	// Name is the trigger's name. Default: <table>_<kind>.
	Name string
	// FlowKey is a column of the table whose value becomes the jobs' flow
	// key: the new row's, or the old row's for a delete (docs/operations.md,
	// "Flow control"). An empty value gives no key, and one longer than 256
	// characters becomes sha256:<its hash in hex>. Default: no key.
	FlowKey string
	// LockWait bounds the wait for the table's lock. Default: DefaultLockWait.
	LockWait time.Duration
}

// Trigger is a dispatch trigger as List reports it.
type Trigger struct {
	Name      string          `json:"name"`
	Table     string          `json:"table"`
	Events    []string        `json:"events"`
	Kind      string          `json:"kind"`
	Queue     string          `json:"queue"`
	Payload   json.RawMessage `json:"payload"`
	When      string          `json:"when,omitempty"`
	FlowKey   string          `json:"flow_key,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	// Present is false when the trigger was dropped by hand, or its table
	// with it; Remove forgets it.
	Present bool `json:"present"`
	// Matches is false when the trigger calls another function, or
	// dispatch_event with other arguments, or fires on other events, than
	// the record says (Add refuses to create such a trigger; one could be
	// left by an older version, or changed by hand). The WHEN condition is
	// checked by Add alone.
	Matches bool `json:"matches"`
}

// Add attaches a dispatch trigger and returns its name. created is false
// when a dispatch trigger of that name exists already; it is left as it is.
// The trigger is created in a transaction (a savepoint when db is one) and
// committed only when its definition is the one recorded; otherwise Add
// returns ErrMismatch and nothing is changed.
func Add(ctx context.Context, db DB, schema string, s Spec) (name string, created bool, err error) {
	payload := s.Payload
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	events := s.Events
	if len(events) == 0 {
		events = []string{"insert"}
	}
	var when, trigName *string
	if s.When != "" {
		when = &s.When
	}
	if s.Name != "" {
		trigName = &s.Name
	}
	queue := s.Queue
	if queue == "" {
		queue = "default"
	}
	op := fmt.Sprintf("add trigger on %s", s.Table)
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", op, err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit, nothing
	sql := "SELECT name, created FROM " + fn(schema, "add_trigger") + "($1, $2, $3, $4, $5, $6, $7, $8"
	args := []any{s.Table, events, s.Kind, payload, queue, when, trigName, lockWait(s.LockWait)}
	if s.FlowKey != "" { // named only when set: a schema before migration 16 has no such argument
		sql += ", flow_key => $9"
		args = append(args, s.FlowKey)
	}
	err = tx.QueryRow(ctx, sql+")", args...).Scan(&name, &created)
	if err != nil {
		return "", false, describe(op, err)
	}
	if created {
		if err := verify(ctx, tx, schema, name); err != nil {
			return "", false, describe(op, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return "", false, describe(op, err)
	}
	return name, created, nil
}

// Remove drops the dispatch trigger called name.
func Remove(ctx context.Context, db DB, schema, name string, wait time.Duration) error {
	if _, err := db.Exec(ctx, "SELECT "+fn(schema, "remove_trigger")+"($1, $2)", name, lockWait(wait)); err != nil {
		return describe(fmt.Sprintf("remove trigger %q", name), err)
	}
	return nil
}

// List returns the dispatch triggers by name.
func List(ctx context.Context, db DB, schema string) ([]Trigger, error) {
	rows, err := db.Query(ctx, `
SELECT e.name, e.table_name, e.events, e.kind, e.queue, e.payload, coalesce(e.when_expr, ''), coalesce(e.flow_key, ''), e.created_at,
       t.oid IS NOT NULL, coalesce(`+strings.ReplaceAll(matchesSQL, "$2", "$1")+`, false)
FROM `+pgx.Identifier{schema, "event_triggers"}.Sanitize()+` e
LEFT JOIN pg_catalog.pg_trigger t ON t.tgrelid = e.table_oid AND t.tgname = e.name
ORDER BY e.name`, fn(schema, "dispatch_event")+"()")
	if err != nil {
		return nil, fmt.Errorf("list triggers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Trigger, error) {
		var t Trigger
		err := r.Scan(&t.Name, &t.Table, &t.Events, &t.Kind, &t.Queue, &t.Payload, &t.When, &t.FlowKey, &t.CreatedAt, &t.Present, &t.Matches)
		for i, e := range t.Events {
			t.Events[i] = strings.ToLower(e)
		}
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list triggers: %w", err)
	}
	return out, nil
}

func fn(schema, name string) string { return pgx.Identifier{schema, name}.Sanitize() }

func lockWait(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultLockWait
	}
	return d
}

// describe turns the server's errors into ones that say what to do.
func describe(op string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("%s: %w", op, err)
	}
	switch pgErr.Code {
	case "55P03": // lock_not_available
		return fmt.Errorf("%s: %w: nothing was changed; try again when it is free (%s)", op, ErrLocked, pgErr.Message)
	case "42704": // undefined_object
		return fmt.Errorf("%s: %w: %s", op, ErrNotFound, pgErr.Message)
	case "42P01", "3F000", "42602": // undefined_table, invalid_schema_name, invalid_name
		return fmt.Errorf("%s: %s", op, pgErr.Message)
	case "42883": // undefined_function: the schema lacks migration 4
		return fmt.Errorf("%s: %s (is the schema migrated? run pgdispatch migrate)", op, pgErr.Message)
	}
	return fmt.Errorf("%s: %w", op, err)
}

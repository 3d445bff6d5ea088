package triggers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrMismatch is returned by Add when the trigger the server created is not
// the one its record describes, as when a WHEN condition closes its clause
// and writes arguments of its own. Nothing was changed.
var ErrMismatch = errors.New("the trigger created is not the one recorded")

// recordSQL reads a dispatch trigger's record beside its pg_trigger row.
// matches is true when the trigger calls dispatch_event() with exactly
// the recorded kind, queue and payload as its three arguments, and the
// recorded flow key's column as a fourth when there is one (compared as
// the bytes the catalog stores), row by row, after the recorded events
// only, with no column list, transition tables or constraint.
const recordSQL = `
SELECT pg_catalog.pg_get_triggerdef(t.oid), pg_catalog.quote_ident(t.tgname),
       e.table_oid::regclass::text, e.events, e.when_expr, e.kind, e.queue, e.payload::text, e.flow_key,
       pg_catalog.current_setting('standard_conforming_strings') = 'on',
       {matches}
FROM {event_triggers} e
JOIN pg_catalog.pg_trigger t ON t.tgrelid = e.table_oid AND t.tgname = e.name
WHERE e.name = $1`

// matchesSQL is recordSQL's matches, over e (the record) and t (the
// pg_trigger row). $2 is dispatch_event's regprocedure text.
const matchesSQL = `(
       t.tgfoid = pg_catalog.to_regprocedure($2)
   AND t.tgtype = 1 -- FOR EACH ROW, AFTER
                  | CASE WHEN 'INSERT' = ANY (e.events) THEN 4 ELSE 0 END
                  | CASE WHEN 'DELETE' = ANY (e.events) THEN 8 ELSE 0 END
                  | CASE WHEN 'UPDATE' = ANY (e.events) THEN 16 ELSE 0 END
   AND e.events <@ ARRAY['INSERT', 'DELETE', 'UPDATE']
   AND t.tgattr::text = '' AND t.tgoldtable IS NULL AND t.tgnewtable IS NULL
   AND t.tgconstraint = 0 AND NOT t.tgisinternal
   AND t.tgnargs = CASE WHEN e.flow_key IS NULL THEN 3 ELSE 4 END
   AND t.tgargs = pg_catalog.convert_to(e.kind, pg_catalog.getdatabaseencoding()) || pg_catalog.decode('00', 'hex')
               || pg_catalog.convert_to(e.queue, pg_catalog.getdatabaseencoding()) || pg_catalog.decode('00', 'hex')
               || pg_catalog.convert_to(e.payload::text, pg_catalog.getdatabaseencoding()) || pg_catalog.decode('00', 'hex')
               || CASE WHEN e.flow_key IS NULL THEN ''::bytea
                       ELSE pg_catalog.convert_to(e.flow_key, pg_catalog.getdatabaseencoding()) || pg_catalog.decode('00', 'hex') END)`

// verify checks, in tx, that the trigger named name is exactly the one its
// record describes: matchesSQL for its function, events and arguments, and
// for its WHEN condition the server's own reading of the recorded
// condition alone. That reading comes from a scratch trigger created in a
// savepoint (and rolled back) whose statement ends in "dispatch_event()":
// nothing after the condition carries a quote for it to close, so the
// condition cannot leave its clause there. The created trigger's
// definition must then be the scratch's with the recorded arguments.
func verify(ctx context.Context, tx pgx.Tx, schema, name string) error {
	dispatch := fn(schema, "dispatch_event")
	var (
		def, quotedName, table, kind, queue, payload string
		events                                       []string
		when, flowKey                                *string
		standardStrings, matches                     bool
	)
	err := tx.QueryRow(ctx, strings.NewReplacer("{matches}", matchesSQL,
		"{event_triggers}", pgx.Identifier{schema, "event_triggers"}.Sanitize()).Replace(recordSQL),
		name, dispatch+"()").Scan(&def, &quotedName, &table, &events, &when, &kind, &queue, &payload, &flowKey, &standardStrings, &matches)
	if err != nil {
		return fmt.Errorf("check the trigger created: %w", err)
	}
	if !matches {
		return fmt.Errorf("%w: %s", ErrMismatch, def)
	}

	// The scratch trigger: the record's events, table and condition.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("check the trigger created: %w", err)
	}
	defer func() { _ = sp.Rollback(ctx) }()
	const scratch = "pgdispatch_when_check"
	ddl := "CREATE TRIGGER " + scratch + " AFTER " + strings.Join(events, " OR ") + " ON " + table + " FOR EACH ROW "
	if when != nil {
		ddl += "WHEN (" + *when + ") "
	}
	ddl += "EXECUTE FUNCTION " + dispatch + "()"
	// The extended protocol: one statement, whatever the text holds.
	if _, err := sp.Conn().PgConn().ExecParams(ctx, ddl, nil, nil, nil, nil).Close(); err != nil {
		return fmt.Errorf("%w: its WHEN condition alone does not make a trigger: %w", ErrMismatch, err)
	}
	var scratchDef string
	if err := sp.QueryRow(ctx, `SELECT pg_catalog.pg_get_triggerdef(t.oid) FROM pg_catalog.pg_trigger t
		WHERE t.tgrelid = $1::regclass AND t.tgname = $2`, table, scratch).Scan(&scratchDef); err != nil {
		return fmt.Errorf("check the trigger created: %w", err)
	}
	if err := sp.Rollback(ctx); err != nil {
		return fmt.Errorf("check the trigger created: %w", err)
	}

	// pg_get_triggerdef writes the arguments as simple_quote_literal does.
	values := []string{kind, queue, payload}
	if flowKey != nil {
		values = append(values, *flowKey)
	}
	args := make([]string, len(values))
	for i, a := range values {
		a = strings.ReplaceAll(a, "'", "''")
		if !standardStrings {
			a = strings.ReplaceAll(a, `\`, `\\`)
		}
		args[i] = "'" + a + "'"
	}
	prefix := "CREATE TRIGGER " + scratch + " "
	want := "CREATE TRIGGER " + quotedName + " " + strings.TrimSuffix(strings.TrimPrefix(scratchDef, prefix), ")") +
		strings.Join(args, ", ") + ")"
	if !strings.HasPrefix(scratchDef, prefix) || !strings.HasSuffix(scratchDef, "()") || def != want {
		return fmt.Errorf("%w: created %s, where the record reads %s", ErrMismatch, def, want)
	}
	return nil
}

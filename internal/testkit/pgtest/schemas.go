package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch/migrations"
)

// A test binary's schemas are named pgdt_<token>_<n>, the token being the
// binary's own. The binary holds the advisory lock (ownerClass, token) on a
// connection of its own for its whole life, so that a schema whose token's
// lock nobody holds was left by a binary that was killed, and can be dropped
// by the next one.
const (
	schemaPrefix = "pgdt_"
	// ownerClass is the first half of the owner locks: "pgtd" in ASCII.
	ownerClass int32 = 0x70677464
	// janitorKey, the second half with ownerClass, is held while one binary
	// drops what killed ones left; tokens are never 0.
	janitorKey int32 = 0
)

// staleSchema matches the schema names of any binary, token in group 1.
// Names other than these, such as those earlier versions of this package
// made, are never touched.
var staleSchema = regexp.MustCompile(`^` + schemaPrefix + `([0-9a-f]{8})_`)

// resetLockTimeout bounds each wait of a reset: for the sleep keys of
// sessions going away, and for the locks TRUNCATE takes.
var resetLockTimeout = 5 * time.Second

var (
	token int32     // this binary's, in every schema name it makes
	owner *pgx.Conn // holds the lock (ownerClass, token)
	seq   atomic.Int64
	idle  schemaPool
)

// schemaName returns a name no schema of this or any other binary has had.
func schemaName() string {
	return fmt.Sprintf("%s%08x_%d", schemaPrefix, token, seq.Add(1))
}

// own picks the binary's token and takes its lock, then drops the schemas
// of binaries that are gone.
func own(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "pgtest-owner"
	cfg.RuntimeParams["lock_timeout"] = "10s"
	cfg.RuntimeParams["statement_timeout"] = "60s"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	for {
		var b [4]byte
		_, _ = rand.Read(b[:])
		token = int32(binary.BigEndian.Uint32(b[:]) >> 1) //nolint:gosec // 31 bits: positive
		if token == janitorKey {
			continue
		}
		// A token whose lock is free and that no schema bears, even one a
		// killed binary of the same token left.
		var got bool
		err := conn.QueryRow(ctx, `SELECT CASE
			WHEN NOT pg_try_advisory_lock($1, $2) THEN false
			WHEN EXISTS (SELECT FROM pg_namespace WHERE starts_with(nspname, $3)) THEN NOT pg_advisory_unlock($1, $2)
			ELSE true END`, ownerClass, token, fmt.Sprintf("%s%08x_", schemaPrefix, token)).Scan(&got)
		if err != nil {
			closeConn(conn)
			return fmt.Errorf("take the owner lock: %w", err)
		}
		if got {
			break
		}
	}
	owner = conn
	return dropStale(ctx, conn)
}

// dropStale drops the schemas of binaries whose owner lock is free: each
// was killed before it could drop its own. One binary at a time does it;
// the others go on.
func dropStale(ctx context.Context, conn *pgx.Conn) error {
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", ownerClass, janitorKey).Scan(&got); err != nil {
		return fmt.Errorf("take the janitor lock: %w", err)
	}
	if !got {
		return nil
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, $2)", ownerClass, janitorKey) //nolint:errcheck // released with the session anyway
	stale, err := staleSchemas(ctx, conn)
	if err != nil {
		return err
	}
	for _, name := range stale {
		began := time.Now()
		_, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
		ddl.add(&ddl.drop, began)
		if err != nil {
			return fmt.Errorf("drop schema %s, left by a test binary that was killed: %w", name, err)
		}
	}
	return nil
}

// staleSchemas lists the schemas whose binary's owner lock is free.
func staleSchemas(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, schemaPrefix)
	if err != nil {
		return nil, fmt.Errorf("list schemas: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list schemas: %w", err)
	}
	// Read after the names: a binary takes its lock before it makes a
	// schema, so the owner of every name read is among these unless gone.
	rows, err = conn.Query(ctx, `SELECT objid::int8 FROM pg_locks
		WHERE locktype = 'advisory' AND classid::int8 = $1 AND objsubid = 2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int64(ownerClass))
	if err != nil {
		return nil, fmt.Errorf("list owners: %w", err)
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list owners: %w", err)
	}
	var stale []string
	for _, name := range names {
		m := staleSchema.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		var tok uint32
		if _, err := fmt.Sscanf(m[1], "%08x", &tok); err != nil || slices.Contains(owners, int64(tok)) {
			continue
		}
		stale = append(stale, name)
	}
	return stale, nil
}

// disown drops the schemas kept for reuse and lets the owner lock go.
func disown() error {
	if owner == nil {
		return nil
	}
	defer func() { closeConn(owner); owner = nil }()
	names := idle.drain()
	if len(names) == 0 {
		return nil
	}
	quoted := make([]string, len(names))
	for i, name := range names {
		quoted[i] = pgx.Identifier{name}.Sanitize()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err := owner.Exec(ctx, "DROP SCHEMA IF EXISTS "+strings.Join(quoted, ", ")+" CASCADE")
	ddl.addN(&ddl.drop, len(names), began)
	if err != nil {
		return fmt.Errorf("drop the reused schemas: %w", err)
	}
	return nil
}

// pooledSchema is a migrated schema that tests take turns on, and what it
// was made of, to tell when a test changed it.
type pooledSchema struct {
	name       string
	oid        uint32   // the namespace's
	tables     []string // quoted: emptied between tests
	tableNames []string // the same, unquoted
	relations  []uint32 // every relation the migrations made: tables, indexes, sequences
	functions  []uint32 // the functions the migrations made
	tableOIDs  []uint32 // those of tables, in the same order
	sequences  []uint32 // the identities' sequences, restarted between tests
	made       []string // the fingerprint, as migrated
}

type schemaPool struct {
	mu    sync.Mutex
	ready []*pooledSchema
}

func (p *schemaPool) take() *pooledSchema {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 {
		return nil
	}
	s := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	return s
}

func (p *schemaPool) put(s *pooledSchema) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready = append(p.ready, s)
}

func (p *schemaPool) drain() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, len(p.ready))
	for i, s := range p.ready {
		names[i] = s.name
	}
	p.ready = nil
	return names
}

// Schema returns a migrated schema for this test alone, empty: no jobs, no
// event triggers, and the ids start at 1. It may have served an earlier
// test of the binary; when the test ends it is emptied for the next one.
// No two tests hold it at once, so its NOTIFY channel and sleep keys, named
// after it, are the test's own.
//
// Whatever the test started on the schema must have stopped by then:
// cleanups run last in, first out, so stop it in a cleanup registered after
// this call, or earlier. Tables and functions the test added to the schema
// are dropped; a schema that a test changed otherwise (a constraint, a
// trigger, a grant, the schema_version) is not reused, nor one that holds
// the planner's statistics, nor that of a test that failed. A test that
// needs a table that is new, for its statistics or its counters, or that
// changes the schema's definition, asks for FreshSchema.
func Schema(t testing.TB) string {
	t.Helper()
	p := ddlPool(t)
	s := idle.take()
	if s == nil {
		s = &pooledSchema{name: schemaName()}
		if err := s.make(p); err != nil {
			dropSchema(t, p, s.name)
			t.Fatalf("pgtest: %v", err)
		}
	}
	t.Cleanup(func() {
		reason := "the test failed"
		if !t.Failed() {
			reason = reset(p, s)
		}
		if reason == "" {
			idle.put(s)
			return
		}
		ddl.discarded(reason)
		t.Logf("pgtest: schema %s is not reused: %s", s.name, reason)
		dropSchema(t, p, s.name)
	})
	return s.name
}

// FreshSchema creates a migrated schema for this test alone and drops it
// when the test ends.
func FreshSchema(t testing.TB) string {
	t.Helper()
	schema := EmptySchemaName(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrate(ctx, ddlPool(t), schema); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return schema
}

// EmptySchemaName returns a fresh schema name, and drops that schema, if
// anything created it, when the test ends.
func EmptySchemaName(t testing.TB) string {
	t.Helper()
	schema := schemaName()
	p := ddlPool(t)
	t.Cleanup(func() { dropSchema(t, p, schema) })
	return schema
}

func dropSchema(t testing.TB, p *pgxpool.Pool, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	_, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	ddl.add(&ddl.drop, began)
	if err != nil {
		t.Errorf("pgtest: drop schema %s: %v", schema, err)
	}
}

func migrate(ctx context.Context, p *pgxpool.Pool, schema string) error {
	began := time.Now()
	_, _, err := migrations.Migrate(ctx, p, migrations.Config{Schema: schema})
	ddl.add(&ddl.migrate, began)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	return nil
}

// make migrates s and notes what it is made of.
func (s *pooledSchema) make(p *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrate(ctx, p, s.name); err != nil {
		return err
	}
	began := time.Now()
	defer ddl.add(&ddl.inspect, began)
	conn, err := p.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("inspect %s: %w", s.name, err)
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, "SELECT oid FROM pg_namespace WHERE nspname = $1", s.name).Scan(&s.oid); err != nil {
		return fmt.Errorf("inspect %s: %w", s.name, err)
	}
	// What is in the schema depends on it: read by pg_depend's index, not
	// by a scan of the catalogs, which many tests swell with dead rows.
	rows, err := conn.Query(ctx, `
		SELECT c.oid, c.relname, c.relkind::text, 'pg_class' FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
		WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = $1 AND d.classid = 'pg_class'::regclass
		UNION ALL
		SELECT i.indexrelid, '', 'i', 'pg_class' FROM pg_index i JOIN pg_depend d ON d.objid = i.indrelid
		WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = $1 AND d.classid = 'pg_class'::regclass
		UNION ALL
		SELECT d.objid, '', '', 'pg_proc' FROM pg_depend d
		WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = $1 AND d.classid = 'pg_proc'::regclass
		ORDER BY 2`, s.oid)
	if err != nil {
		return fmt.Errorf("inspect %s: %w", s.name, err)
	}
	var (
		oid              uint32
		name, kind, from string
	)
	if _, err := pgx.ForEachRow(rows, []any{&oid, &name, &kind, &from}, func() error {
		switch {
		case from == "pg_proc":
			s.functions = append(s.functions, oid)
			return nil
		case kind == "r" && name != "schema_version":
			s.tableNames = append(s.tableNames, name)
			s.tableOIDs = append(s.tableOIDs, oid)
			s.tables = append(s.tables, pgx.Identifier{s.name, name}.Sanitize())
		case kind == "S":
			s.sequences = append(s.sequences, oid)
		}
		s.relations = append(s.relations, oid)
		return nil
	}); err != nil {
		return fmt.Errorf("inspect %s: %w", s.name, err)
	}
	s.made, err = s.fingerprint(ctx, conn.Conn())
	return err
}

// reset readies s for the next test, in one transaction, and returns why it
// cannot be reused, or "". It waits for the sleep keys of claimers that are
// going away (the sessions of a killed process end soon after it), drops
// the tables and functions the test added, checks that what is left is what
// the migrations made, and empties the tables.
func reset(p *pgxpool.Pool, s *pooledSchema) string {
	began := time.Now()
	defer ddl.add(&ddl.reset, began)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := p.Begin(ctx)
	if err != nil {
		return err.Error()
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after a commit, a no-op
	reason, err := s.reset(ctx, tx)
	if err == nil && reason == "" {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return err.Error()
	}
	return reason
}

// smallTable is the most rows a table may hold to be emptied by DELETE
// rather than TRUNCATE.
const smallTable = 1000

func (s *pooledSchema) reset(ctx context.Context, tx pgx.Tx) (string, error) {
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)",
		fmt.Sprintf("%dms", resetLockTimeout.Milliseconds())); err != nil {
		return "", err
	}
	key := migrations.SleepKey(s.name)
	rows, err := tx.Query(ctx, `SELECT DISTINCT objid::int8 FROM pg_locks
		WHERE locktype = 'advisory' AND classid::int8 = $1 AND objsubid = 2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int64(uint32(key)))
	if err != nil {
		return "", err
	}
	queues, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return "", err
	}
	for _, q := range queues {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", key, int32(uint32(q))); err != nil { //nolint:gosec // the int4 the key was made of
			return "", fmt.Errorf("a sleep key is still held: %w", err)
		}
	}
	// No VACUUM or ANALYZE can run on the tables from here on: the
	// statistics read below are the ones the next test would meet.
	tables := strings.Join(s.tables, ", ")
	if _, err := tx.Exec(ctx, "LOCK TABLE "+tables+" IN SHARE UPDATE EXCLUSIVE MODE"); err != nil {
		return "", err
	}
	now, err := s.fingerprint(ctx, tx.Conn())
	if err != nil {
		return "", err
	}
	if !slices.Equal(now, s.made) {
		if err := s.dropAdded(ctx, tx); err != nil {
			return "", err
		}
		if now, err = s.fingerprint(ctx, tx.Conn()); err != nil {
			return "", err
		}
		if !slices.Equal(now, s.made) {
			return difference(s.made, now), nil
		}
	}
	return "", s.empty(ctx, tx, tables)
}

// empty deletes the rows of s's tables and restarts its identities. A table
// that holds many rows, or that a VACUUM or an ANALYZE saw, is truncated
// instead, which also resets what the planner knows of its size. DELETE
// leaves only dead rows behind, and spares the new files and catalog
// updates of TRUNCATE for every table and index, which on a busy server
// cost nearly what a migration does.
func (s *pooledSchema) empty(ctx context.Context, tx pgx.Tx, tables string) error {
	var checks []string
	for i, t := range s.tables {
		checks = append(checks, fmt.Sprintf("(SELECT count(*) FROM (SELECT FROM %s LIMIT %d) r) <= %d AND (SELECT reltuples < 0 FROM pg_class WHERE oid = %d)",
			t, smallTable+1, smallTable, s.tableOIDs[i]))
	}
	var small bool
	if err := tx.QueryRow(ctx, "SELECT "+strings.Join(checks, " AND ")).Scan(&small); err != nil {
		return err
	}
	if !small {
		_, err := tx.Exec(ctx, "TRUNCATE "+tables+" RESTART IDENTITY")
		return err
	}
	sql := make([]string, 0, len(s.tables)+len(s.sequences))
	for _, t := range s.tables {
		sql = append(sql, "DELETE FROM "+t)
	}
	for _, seq := range s.sequences {
		sql = append(sql, fmt.Sprintf("SELECT setval(%d::oid::regclass, seqstart, false) FROM pg_sequence WHERE seqrelid = %d", seq, seq))
	}
	_, err := tx.Exec(ctx, strings.Join(sql, "; "))
	return err
}

// dropAdded drops the tables, views and functions in s that the migrations
// did not make, and with them what hangs on them (triggers, indexes).
func (s *pooledSchema) dropAdded(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `
		SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, c.relname, NULL
		FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
		WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = $1 AND d.classid = 'pg_class'::regclass
		  AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.oid <> ALL ($2::oid[])
		UNION ALL
		SELECT CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END, p.proname,
		       pg_get_function_identity_arguments(p.oid)
		FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
		WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = $1 AND d.classid = 'pg_proc'::regclass
		  AND p.oid <> ALL ($3::oid[])`, s.oid, s.relations, s.functions)
	if err != nil {
		return err
	}
	var drops []string
	var kind, name string
	var args *string
	if _, err := pgx.ForEachRow(rows, []any{&kind, &name, &args}, func() error {
		sql := "DROP " + kind + " IF EXISTS " + pgx.Identifier{s.name, name}.Sanitize()
		if args != nil {
			sql += "(" + *args + ")" // the server's own rendering of the argument types
		}
		drops = append(drops, sql+" CASCADE")
		return nil
	}); err != nil {
		return err
	}
	for _, sql := range drops {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

// fingerprintSQL describes a schema's definition, one line an object, from
// the schema's oid ($1) and name ($4), the oids of the relations ($2) and
// functions ($3) the migrations made, and the names of its tables ($5): a change to any of them, an object dropped and made
// again, or a new object in the schema or on its tables (each is a new
// dependency) changes a line, and so do the planner's statistics. It reads
// the catalogs by their indexes: a server that ran many tests has catalogs
// swollen with dead rows.
const fingerprintSQL = `
SELECT format('schema owner=%s acl=%s', nspowner, nspacl) FROM pg_namespace WHERE oid = $1
UNION ALL
SELECT format('dependency %s/%s/%s on %s/%s/%s %s', classid, objid, objsubid, refclassid, refobjid, refobjsubid, deptype)
FROM pg_depend
WHERE (refclassid = 'pg_namespace'::regclass AND refobjid = $1)
   OR (refclassid = 'pg_class'::regclass AND refobjid = ANY ($2::oid[]))
   OR (refclassid = 'pg_proc'::regclass AND refobjid = ANY ($3::oid[]))
UNION ALL
SELECT format('relation %s %s kind=%s owner=%s acl=%s options=%s persistence=%s rls=%s/%s',
              oid, relname, relkind, relowner, relacl, reloptions, relpersistence, relrowsecurity, relforcerowsecurity)
FROM pg_class WHERE oid = ANY ($2::oid[])
UNION ALL
SELECT format('column %s.%s type=%s/%s notnull=%s dropped=%s acl=%s', attrelid, attname, atttypid, atttypmod, attnotnull, attisdropped, attacl)
FROM pg_attribute WHERE attrelid = ANY ($2::oid[]) AND attnum > 0
UNION ALL
SELECT format('default %s.%s %s', adrelid, adnum, pg_get_expr(adbin, adrelid)) FROM pg_attrdef WHERE adrelid = ANY ($2::oid[])
UNION ALL
SELECT format('constraint %s %s validated=%s %s', oid, conname, convalidated, pg_get_constraintdef(oid))
FROM pg_constraint WHERE conrelid = ANY ($2::oid[])
UNION ALL
SELECT format('trigger %s %s on=%s enabled=%s', oid, tgname, tgrelid, tgenabled) FROM pg_trigger WHERE tgrelid = ANY ($2::oid[])
UNION ALL
SELECT format('function %s %s owner=%s acl=%s config=%s secdef=%s body=%s', oid, proname, proowner, proacl, proconfig, prosecdef, hashtext(prosrc))
FROM pg_proc WHERE oid = ANY ($3::oid[])
UNION ALL
SELECT format('default privileges %s', oid) FROM pg_default_acl WHERE defaclnamespace = $1
UNION ALL
SELECT format('statistics %s.%s', tablename, attname) FROM pg_stats WHERE schemaname = $4 AND tablename = ANY ($5::text[])`

// fingerprint returns s's definition as sorted lines, its schema_version
// among them.
func (s *pooledSchema) fingerprint(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, fingerprintSQL+`
		UNION ALL SELECT 'version ' || version FROM `+pgx.Identifier{s.name, "schema_version"}.Sanitize(), s.oid, s.relations, s.functions, s.name, s.tableNames)
	if err != nil {
		return nil, fmt.Errorf("describe %s: %w", s.name, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("describe %s: %w", s.name, err)
	}
	slices.Sort(lines)
	return lines, nil
}

// difference says why a schema that was made as made and is now as now
// cannot be reused, naming the first lines that are gone or new.
func difference(made, now []string) string {
	var out []string
	analyzed := false
	for _, l := range made {
		if _, found := slices.BinarySearch(now, l); !found {
			out = append(out, "-"+l)
		}
	}
	for _, l := range now {
		if _, found := slices.BinarySearch(made, l); !found {
			out = append(out, "+"+l)
			analyzed = analyzed || strings.HasPrefix(l, "statistics ")
		}
	}
	if len(out) > 3 {
		out = append(out[:3], fmt.Sprintf("and %d more", len(out)-3))
	}
	if analyzed && len(out) > 0 {
		return "its tables have the planner's statistics: " + strings.Join(out, "; ")
	}
	return "the test changed it: " + strings.Join(out, "; ")
}

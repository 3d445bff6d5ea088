// Package migrations holds pgdispatch's schema as embedded tern migrations and
// applies them to a schema of the caller's choosing.
//
// Migrate is safe to run from many processes at once: it takes an advisory
// lock scoped to the schema, and every DDL statement runs under a lock_timeout
// so that a migration never makes the application's writers queue behind it.
package migrations

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed sql/*.sql
var files embed.FS

// DefaultSchema is the schema pgdispatch lives in unless told otherwise.
const DefaultSchema = "pgdispatch"

// SleepKey is the first half of schema's sleep key, the advisory lock a
// sleeping claimer holds and writers try (migration 007); the second half is
// the server's hashtext(queue). It is an FNV-1a hash of the schema's name,
// computed here rather than by the server, so that the literal migration 007
// writes into the triggers matches the claimer's on any server: one restored
// from a dump taken on a machine of the other byte order included.
func SleepKey(schema string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte("pgdispatch.sleep/" + schema))
	return int32(h.Sum32()) //nolint:gosec // a hash: wrapping to negative is fine
}

// The limits of a job's row, which the jobs table's constraints enforce at
// INSERT and UPDATE (migration 008). Code that writes rows keeps within them:
// the claim counts attempts up to AttemptsLimit and no further.
const (
	// AttemptsLimit bounds attempts and max_attempts.
	AttemptsLimit = 1_000_000
	// PayloadLimit bounds a payload's size in bytes, as pg_column_size
	// measures the jsonb value uncompressed.
	PayloadLimit = 1 << 20
	// NameLimit bounds the characters of a queue's and a kind's name.
	NameLimit = 128
	// DedupKeyLimit bounds the characters of a dedup_key.
	DedupKeyLimit = 512
)

// RunAtMin is the earliest run_at allowed, Go's zero time, and RunAtEnd
// the first one refused: Go's JSON and Python's datetime cannot write the
// year 10000, and RunAtEnd keeps a year of margin from it for every time zone.
var (
	RunAtMin = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	RunAtEnd = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ternLock is the advisory lock tern's migrator takes (its lockNum).
const ternLock = int64(9628173550095224)

const (
	versionTable        = "schema_version"
	defaultLockTimeout  = 5 * time.Second
	defaultTotalTimeout = 2 * time.Minute
)

// ErrSchemaMissing is returned by Check when the schema or its version table
// does not exist.
var ErrSchemaMissing = errors.New("schema is missing")

// ErrSchemaOutdated is returned by Check when the schema is older than the
// migrations embedded in this binary.
var ErrSchemaOutdated = errors.New("schema is older than this binary")

// missingError says that schema is not installed and what to run; it is
// ErrSchemaMissing.
type missingError struct{ schema string }

func (e missingError) Error() string {
	return fmt.Sprintf("schema %q is not installed in this database: run 'pgdispatch migrate' first, or start with 'pgdispatch run --migrate'", e.schema)
}

func (missingError) Unwrap() error { return ErrSchemaMissing }

// SchemaMissing is Check's error for a schema that is not installed, for
// a caller that finds it missing another way (a statement naming its
// functions fails): it says what to run, and is ErrSchemaMissing.
func SchemaMissing(schema string) error { return missingError{cmp.Or(schema, DefaultSchema)} }

// Config configures Migrate.
type Config struct {
	// Schema is the schema to migrate. Default: DefaultSchema.
	Schema string
	// LockTimeout bounds how long any DDL statement waits for a lock.
	// Default: 5s.
	LockTimeout time.Duration
	// Timeout bounds the whole migration, including waiting for another
	// migrating process. Default: 2m.
	Timeout time.Duration
}

func (c *Config) withDefaults() Config {
	return Config{
		Schema:      cmp.Or(c.Schema, DefaultSchema),
		LockTimeout: cmp.Or(c.LockTimeout, defaultLockTimeout),
		Timeout:     cmp.Or(c.Timeout, defaultTotalTimeout),
	}
}

// Latest is the version the embedded migrations bring a schema to.
func Latest() int32 {
	names, err := migrate.FindMigrations(sqlFS())
	if err != nil {
		panic(fmt.Sprintf("embedded migrations: %v", err)) // impossible: checked by tests
	}
	return int32(len(names))
}

func sqlFS() fs.FS {
	sub, err := fs.Sub(files, "sql")
	if err != nil {
		panic(err)
	}
	return sub
}

// Migrate brings cfg.Schema up to Latest on a connection from pool. It returns
// the version it found and the version it left.
func Migrate(ctx context.Context, pool *pgxpool.Pool, cfg Config) (from, to int32, err error) {
	return migrateTo(ctx, pool, cfg, -1)
}

// migrateTo brings cfg.Schema to version target, or to Latest when target
// is negative.
func migrateTo(ctx context.Context, pool *pgxpool.Pool, cfg Config, target int32) (from, to int32, err error) {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	pooled, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: acquire connection: %w", err)
	}
	// Session settings and locks must not leak back into the pool.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing a private connection

	return migrateConn(ctx, conn, cfg, target)
}

func migrateConn(ctx context.Context, conn *pgx.Conn, cfg Config, target int32) (from, to int32, err error) {
	// The functions' bodies are quoted with $$, and the schema's name is
	// written into them: a name holding $$ would end a body early.
	if strings.Contains(cfg.Schema, "$$") {
		return 0, 0, fmt.Errorf("migrate: schema name %q contains \"$$\", which pgdispatch's SQL functions cannot hold; choose another name", cfg.Schema)
	}
	// A schema's NOTIFY channel is its name; the operators' controls go to
	// every schema's workers on the channel pgdispatch.control.
	if cfg.Schema == "pgdispatch.control" {
		return 0, 0, fmt.Errorf("migrate: schema name %q is the control channel's, which every schema's workers listen on; choose another name", cfg.Schema)
	}
	// One migrator per schema at a time. tern's own lock is global; this one
	// also covers CREATE SCHEMA, which is not safe to race. Another
	// migrator's whole run is waited for, within Timeout: lock_timeout,
	// set after, bounds the DDL statements alone.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext('pgdispatch.migrate'), hashtext($1))", cfg.Schema); err != nil {
		return 0, 0, fmt.Errorf("migrate: wait for migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), //nolint:errcheck // the connection is closed right after
		"SELECT pg_advisory_unlock(hashtext('pgdispatch.migrate'), hashtext($1))", cfg.Schema)
	// tern takes its own lock, one for the whole database, around its
	// version table and its run, under the lock_timeout set below: a
	// migrator of another schema running longer than LockTimeout made this
	// one fail. Taken here first, within Timeout, tern's takes are its
	// session's again.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", ternLock); err != nil {
		return 0, 0, fmt.Errorf("migrate: wait for the database's migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", ternLock) //nolint:errcheck // as above
	if _, err := conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)",
		fmt.Sprintf("%dms", cfg.LockTimeout.Milliseconds())); err != nil {
		return 0, 0, fmt.Errorf("migrate: set lock_timeout: %w", err)
	}

	schema := pgx.Identifier{cfg.Schema}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
		return 0, 0, fmt.Errorf("migrate: create schema %s: %w", schema, describe(err))
	}

	m, err := migrate.NewMigrator(ctx, conn, pgx.Identifier{cfg.Schema, versionTable}.Sanitize())
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: version table: %w", describe(err))
	}
	m.Data = map[string]any{
		"schema":           schema,
		"schema_literal":   quoteLiteral(cfg.Schema),
		"sleep_key_prefix": quoteLiteral(cfg.Schema + "/"),
		"sleep_key":        strconv.FormatInt(int64(SleepKey(cfg.Schema)), 10),
	}
	if err := m.LoadMigrations(sqlFS()); err != nil {
		return 0, 0, fmt.Errorf("migrate: load migrations: %w", err)
	}
	from, err = m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: read version: %w", err)
	}
	if target < 0 {
		err = m.Migrate(ctx)
	} else {
		err = m.MigrateTo(ctx, target)
	}
	if err != nil {
		return from, 0, fmt.Errorf("migrate: %w", describe(err))
	}
	to, err = m.GetCurrentVersion(ctx)
	if err != nil {
		return from, 0, fmt.Errorf("migrate: read version: %w", err)
	}
	return from, to, nil
}

// quoteLiteral quotes s as an SQL string literal of the form E'...', so that it
// means the same whatever standard_conforming_strings says.
func quoteLiteral(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	return "E'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// describe adds a hint to the errors a migration meets most.
func describe(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return fmt.Errorf("%w (a lock was held too long by another session; retry when it is released)", err)
	}
	return err
}

// Check reports whether schema exists at the version this binary needs. It
// returns the version found; an error that is ErrSchemaMissing or
// ErrSchemaOutdated when it cannot be used, which says what to run. A newer schema is accepted: migrations only
// add, so an older binary keeps working during a rolling upgrade.
func Check(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string,
) (int32, error) {
	schema = cmp.Or(schema, DefaultSchema)
	var exists bool
	err := db.QueryRow(ctx,
		"SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{schema, versionTable}.Sanitize()).Scan(&exists)
	if err != nil {
		return 0, fmt.Errorf("check schema: %w", err)
	}
	if !exists {
		return 0, SchemaMissing(schema)
	}
	var version int32
	if err := db.QueryRow(ctx, "SELECT version FROM "+pgx.Identifier{schema, versionTable}.Sanitize()).Scan(&version); err != nil {
		return 0, fmt.Errorf("check schema: read version: %w", err)
	}
	if version == 0 {
		return 0, SchemaMissing(schema)
	}
	if version < Latest() {
		return version, fmt.Errorf("%w: %q is at version %d, this binary needs %d: run 'pgdispatch migrate', or start with 'pgdispatch run --migrate'",
			ErrSchemaOutdated, schema, version, Latest())
	}
	return version, nil
}

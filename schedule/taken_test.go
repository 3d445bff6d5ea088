package schedule_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/schedule"
)

// A slot whose dedup_key a job holds already (only the schema's owner can
// put one there now, but a job inserted before the keys were reserved
// may) creates no job, and says so: the schedule counts it in taken, not
// in runs, its warning names the key and the job that holds it, and the
// worker logs it.
func TestTakenSlotIsShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.exec(t, "SELECT "+pgx.Identifier{e.schema, "schedule"}.Sanitize()+"('tick', NULL, 'noop', every => '1 hour')")
	slot := utc("2030-01-01T00:00:00Z")
	e.exec(t, "UPDATE "+e.schedules+" SET next_run_at = $1", slot)
	var holder int64
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SET LOCAL pgdispatch.firing = on") // the owner may
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, "INSERT INTO "+e.jobs+` (kind, payload, run_at, dedup_key)
		VALUES ('noop', '{"from": "elsewhere"}', $1, 'schedule:tick:2030-01-01T00:00:00Z') RETURNING id`, slot).Scan(&holder))
	require.NoError(t, tx.Commit(ctx))

	core, logs := observer.New(zap.WarnLevel)
	s, err := schedule.New(schedule.Config{
		Pool: pgtest.Pool(t), Schema: e.schema, Logger: zap.New(core),
		Now: func() time.Time { return slot.Add(time.Minute) },
	})
	require.NoError(t, err)
	res, err := s.Pass(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Created)

	var runs, taken int64
	var warning *string
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT runs, taken, warning FROM "+e.schedules).Scan(&runs, &taken, &warning))
	require.Zero(t, runs, "the slot created no job")
	require.EqualValues(t, 1, taken)
	require.NotNil(t, warning)
	require.Contains(t, *warning, "schedule:tick:2030-01-01T00:00:00Z")
	require.Contains(t, *warning, "job "+itoa(holder))
	require.EqualValues(t, 1, res.Taken)
	require.EqualValues(t, 1, s.Stats().Taken)
	found := logs.FilterMessageSnippet("held by another job").All()
	require.Len(t, found, 1)
	require.Equal(t, map[string]any{
		"schedule_id": int64(1), "taken": int64(1), "dedup_key": "schedule:tick:2030-01-01T00:00:00Z", "held_by": holder,
	}, found[0].ContextMap())

	// The next slot is the schedule's own again.
	s2, err := schedule.New(schedule.Config{Pool: pgtest.Pool(t), Schema: e.schema, Now: func() time.Time { return slot.Add(time.Hour) }})
	require.NoError(t, err)
	res, err = s2.Pass(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Created)
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT runs, taken FROM "+e.schedules).Scan(&runs, &taken))
	require.EqualValues(t, 1, runs)
	require.EqualValues(t, 1, taken)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

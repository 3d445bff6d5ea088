package executors_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

func TestRecordResult(t *testing.T) {
	ctx, a := executors.WithAttempt(context.Background())
	assert.Nil(t, a.Result())
	require.NoError(t, executors.RecordResult(ctx, map[string]int{"status": 200}))
	assert.JSONEq(t, `{"status":200}`, string(a.Result()))

	err := executors.RecordResult(ctx, strings.Repeat("x", executors.MaxResultBytes))
	require.ErrorContains(t, err, "larger than 4096")
	assert.JSONEq(t, `{"status":200}`, string(a.Result()), "a refused result keeps the one before")

	require.Error(t, executors.RecordResult(ctx, func() {}), "a value JSON cannot hold")
	assert.JSONEq(t, `{"status":200}`, string(a.Result()))

	require.ErrorIs(t, executors.RecordResult(context.Background(), 1), executors.ErrNoAttempt)
}

func TestSnooze(t *testing.T) {
	var s *executors.SnoozeError
	require.ErrorAs(t, executors.Snooze(time.Minute), &s)
	assert.Equal(t, time.Minute, s.Delay)
	require.ErrorAs(t, executors.Snooze(-time.Second), &s)
	assert.Zero(t, s.Delay)
}

type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// A result is stored as jsonb, which refuses NUL, lone surrogates, invalid
// UTF-8 and numbers past numeric's range: what Go's JSON lets through of
// them is cleaned, or the result refused.
func TestRecordResultFitsJSONB(t *testing.T) {
	ctx, a := executors.WithAttempt(context.Background())
	require.NoError(t, executors.RecordResult(ctx, map[string]any{
		"nul\x00key": "a\x00b", "lone": rawJSON(`"\udc00"`), "bytes": rawJSON("\"\xff\""),
		"pair": rawJSON(`"\ud83d\ude00"`), "n": rawJSON(`1.5e300`), "list": []any{"\x00", 1},
	}))
	assert.JSONEq(t, `{"nul\ufffdkey": "a\ufffdb", "lone": "\ufffd", "bytes": "\ufffd", "pair": "😀", "n": 1.5e300, "list": ["\ufffd", 1]}`,
		string(a.Result()))
	assert.NotContains(t, string(a.Result()), `\u0000`)

	for _, n := range []string{`1e1001`, `1e-1001`, `1e99999999999999999999`} {
		require.Error(t, executors.RecordResult(ctx, map[string]any{"n": rawJSON(n)}), n)
	}
	assert.Contains(t, string(a.Result()), "1.5e300", "a refused result keeps the one before")
}

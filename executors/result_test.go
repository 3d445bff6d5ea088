package executors_test

import (
	"context"
	"errors"
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
	require.True(t, errors.As(executors.Snooze(time.Minute), &s))
	assert.Equal(t, time.Minute, s.Delay)
	require.True(t, errors.As(executors.Snooze(-time.Second), &s))
	assert.Zero(t, s.Delay)
}

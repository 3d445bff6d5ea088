package atworker_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/atworker"
)

// RowCounts reads as a person counts: the total, then the AT Worker's
// statuses in their order, then any others by name.
func TestRowCountsString(t *testing.T) {
	t.Parallel()
	for want, c := range map[string]atworker.RowCounts{
		"0 rows":                          nil,
		"3 rows (1 pending, 2 completed)": {"completed": 2, "pending": 1},
		"4 rows (1 processing, 1 failed, 2 stuck)": {"stuck": 2, "failed": 1, "processing": 1, "completed": 0},
		"3 rows (1 a\x1b, 2 z)":                    {"z": 2, "a\x1b": 1},
	} {
		require.Equal(t, want, c.String())
	}
}

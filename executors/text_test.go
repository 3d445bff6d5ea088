package executors_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

func TestExcerpt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"250 2.0.0 OK\r\n\tqueued", 100, "250 2.0.0 OK   queued"},
		{"\x1b[31mred\u202e\xff", 100, `\x1b[31mred\u202e` + "\uFFFD"},
		{"a\x1b", 4, "a"}, // not within an escape
		{"ééé", 5, "éé"},  // not within a character
		{"", 10, ""},
	} {
		got := executors.Excerpt(c.in, c.n)
		require.Equal(t, c.want, got, "%q", c.in)
		require.LessOrEqual(t, len(got), c.n)
		require.True(t, utf8.ValidString(got))
	}
	require.Len(t, executors.Excerpt(strings.Repeat("\x00", 1000), 256), 256)
}

package termsafe

import (
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text, ünïcödé and 漢字 \\ kept": "plain text, ünïcödé and 漢字 \\ kept",
		"\x1b[31mred\x07\r\n\t":              `\x1b[31mred\a\r\n\t`,
		"del \x7f c1 \u009b nel \u0085":      `del \x7f c1 \u009b nel \u0085`,
		"rlo \u202e ls \u2028":               `rlo \u202e ls \u2028`,
		"bad \xff\xfe utf8, real \ufffd":     `bad \xff\xfe utf8, real ` + "\ufffd",
	} {
		require.Equal(t, want, String(in), "%q", in)
	}
	require.Equal(t, "{\n  \"a\": \"\\x1b\"\n}", Lines("{\n  \"a\": \"\x1b\"\n}")) //nolint:testifylint // the exact text, not its JSON
}

func FuzzPrintable(f *testing.F) {
	f.Add("\x1b]0;title\x07")
	f.Add("a\xffb\u202e")
	f.Fuzz(func(t *testing.T, s string) {
		out := String(s)
		require.True(t, utf8.ValidString(out))
		for _, r := range out {
			require.True(t, strconv.IsGraphic(r), "%q left %U", s, r)
		}
	})
}

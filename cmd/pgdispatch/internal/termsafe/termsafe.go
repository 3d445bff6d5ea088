// Package termsafe escapes what a terminal would act on in text written to
// it.
//
// Rows are written by anyone allowed to INSERT a job, and last_error holds
// the first bytes of a receiver's reply: the admin commands treat every
// column as hostile, and pass each value of their human output through
// String, so that no escape sequence reaches the terminal.
package termsafe

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// String escapes what a terminal would act on in s: control characters
// (C0, DEL and C1), line and paragraph separators, bidirectional and other
// format characters, and bytes that are not UTF-8. They are written as
// strconv.QuoteToGraphic writes them (\x1b, \a, \r, \u009b, \u202e);
// everything else is kept as it is.
func String(s string) string {
	return escape(s, false)
}

// Lines is String for text whose line breaks are its own, such as indented
// JSON (where a raw line break cannot stand in a string).
func Lines(s string) string {
	return escape(s, true)
}

func escape(s string, keepNewlines bool) string {
	var (
		b       strings.Builder
		escaped bool // b holds s up to i, escaped
	)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		notUTF8 := r == utf8.RuneError && size == 1
		switch {
		case !notUTF8 && strconv.IsGraphic(r), r == '\n' && keepNewlines:
			// Letters, marks, numbers, punctuation, symbols and spaces
			// show as themselves.
			if escaped {
				b.WriteString(s[i : i+size])
			}
		default:
			if !escaped {
				b.WriteString(s[:i])
				escaped = true
			}
			if notUTF8 {
				fmt.Fprintf(&b, `\x%02x`, s[i])
			} else {
				q := strconv.QuoteRuneToGraphic(r)
				b.WriteString(q[1 : len(q)-1])
			}
		}
		i += size
	}
	if !escaped {
		return s
	}
	return b.String()
}

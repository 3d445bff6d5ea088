package executors

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable makes text from outside (a receiver's reply, a server's error,
// a panic's message) safe to store and to show on a terminal: invalid UTF-8
// becomes U+FFFD, and control and format characters other than tab and line
// feed (ESC, BEL, CR, DEL, C1, bidirectional overrides) are written as Go
// escapes such as \x1b or \u202e.
func Printable(s string) string {
	clean := true
	for _, r := range s {
		if r == unicode.ReplacementChar || (!unicode.IsPrint(r) && r != '\t' && r != '\n') {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '\t' || r == '\n' || unicode.IsPrint(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

// Excerpt is at most n bytes of s made safe to store and to show on one
// line: tabs and line breaks become spaces, and the rest is escaped as
// Printable escapes it. It is cut between two characters, never within one
// or within an escape.
func Excerpt(s string, n int) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s) // U+FFFD for a byte that is not UTF-8
		s = s[size:]
		if r == '\t' || r == '\n' || r == '\r' {
			r = ' '
		}
		piece := Printable(string(r))
		if b.Len()+len(piece) > n {
			break
		}
		b.WriteString(piece)
	}
	return b.String()
}

package executors

import (
	"fmt"
	"strings"
	"unicode"
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

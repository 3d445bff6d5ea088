package redact

import (
	"regexp"
	"strings"
)

var (
	// jsonMember is a JSON member, "key": value, whose value is a string
	// (one cut short runs to the end of the text) or a number, true, false
	// or null.
	jsonMember = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"\s*:\s*("(?:[^"\\]|\\.)*(?:"|\\?$)|[-+.0-9A-Za-z]+)`)
	// authScheme is the credentials after an HTTP authentication scheme:
	// Bearer abc, Basic dXNlcjpwdw==.
	authScheme = regexp.MustCompile(`(?i)\b(?:bearer|basic|digest|token)\s+([A-Za-z0-9._~+/=-]+)`)
	// smtpAuth is the initial response of an SMTP AUTH command, as a server
	// that quotes the command echoes it: AUTH PLAIN AHVzZXIAcHc=.
	smtpAuth = regexp.MustCompile(`(?i)\bAUTH\s+(?:PLAIN|LOGIN|XOAUTH2?|OAUTHBEARER|CRAM-MD5|DIGEST-MD5|SCRAM-[A-Z0-9-]+|NTLM|GSSAPI|EXTERNAL)\s+([A-Za-z0-9+/=]+)`)
	// keyValue is key=value, or key: value, as in a query, a form or a
	// header. A value in quotes may be cut short.
	keyValue = regexp.MustCompile(`([A-Za-z0-9_.-]+)(?:=|:[ \t]*)("[^"]*"?|'[^']*'?|[^\s&"',;<>]+)`)
)

// Text masks what looks like a secret in free text that may have been cut
// short, such as the first bytes of a receiver's reply: the user info and
// the query and fragment values of URLs, as URLs masks them; the value of a
// JSON member, a key=value pair or a "key: value" line whose key says it
// holds a secret, by the names Payload masks (token, password, secret,
// Authorization, X-Api-Key and the like); the credentials after Bearer,
// Basic, Digest or Token; and the initial response of an SMTP AUTH
// command. A value cut short by the end of s is masked whole.
func Text(s string) string {
	s = URLs(s)
	s = replaceGroup(jsonMember, s, 2, func(m []string) bool { return secretKey(m[1]) }, `"`+Mask+`"`)
	s = replaceGroup(authScheme, s, 1, func([]string) bool { return true }, Mask)
	s = replaceGroup(smtpAuth, s, 1, func([]string) bool { return true }, Mask)
	return replaceGroup(keyValue, s, 2, func(m []string) bool { return secretKey(m[1]) && m[2] != Mask }, Mask)
}

// replaceGroup replaces submatch group of every match of re in s for which
// secret is true with mask.
func replaceGroup(re *regexp.Regexp, s string, group int, secret func(m []string) bool, mask string) string {
	var (
		b        strings.Builder
		last     int
		replaced bool
	)
	for _, idx := range re.FindAllStringSubmatchIndex(s, -1) {
		m := make([]string, len(idx)/2)
		for i := range m {
			if idx[2*i] >= 0 {
				m[i] = s[idx[2*i]:idx[2*i+1]]
			}
		}
		if !secret(m) {
			continue
		}
		start, end := idx[2*group], idx[2*group+1]
		b.WriteString(s[last:start])
		b.WriteString(mask)
		last, replaced = end, true
	}
	if !replaced {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

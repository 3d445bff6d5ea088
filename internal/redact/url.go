package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// urlInText finds URLs in free text: a scheme and "://", or "//" alone (a
// URL relative to the scheme), and what follows up to a space or a quote.
var urlInText = regexp.MustCompile("(?:[A-Za-z][A-Za-z0-9+.-]*:)?//[^\\s\"'<>`]+")

// URLs masks the user info and the query and fragment values of every URL
// in s, and the tokens in the path of a known webhook's URL (see Path):
// https://bob:pw@host/p?token=t becomes https://bob:xxxxx@host/p?token=xxxxx.
// A user info without a password may be a token, and is masked whole. A
// password may hold '/', '?', '#' or '@' unencoded: when the authority
// holds a ':' and no '@' before the first of them, the user info runs to
// the last '@' of the URL.
func URLs(s string) string {
	return urlInText.ReplaceAllStringFunc(s, maskURL)
}

// urlParts is a URL in text cut into its parts, as written.
type urlParts struct {
	prefix      string // "scheme://" or "//"
	userinfo    string
	hasUserinfo bool
	host        string
	path        string
	query       string
	hasQuery    bool
	fragment    string
	hasFragment bool
}

func splitURL(u string) urlParts {
	var p urlParts
	i := strings.Index(u, "//")
	p.prefix, u = u[:i+2], u[i+2:]
	end := authorityEnd(u)
	at := strings.LastIndexByte(u[:end], '@')
	if at < 0 && strings.Contains(u[:end], ":") {
		at = strings.LastIndexByte(u, '@')
	}
	if at >= 0 {
		p.userinfo, p.hasUserinfo, u = u[:at], true, u[at+1:]
		end = authorityEnd(u)
	}
	p.host, u = u[:end], u[end:]
	u, p.fragment, p.hasFragment = strings.Cut(u, "#")
	p.path, p.query, p.hasQuery = strings.Cut(u, "?")
	return p
}

func authorityEnd(s string) int {
	if end := strings.IndexAny(s, "/?#"); end >= 0 {
		return end
	}
	return len(s)
}

func maskURL(u string) string {
	p := splitURL(u)
	var b strings.Builder
	b.WriteString(p.prefix)
	if p.hasUserinfo {
		if user, _, hasPassword := strings.Cut(p.userinfo, ":"); hasPassword {
			b.WriteString(user + ":" + Mask)
		} else {
			b.WriteString(Mask)
		}
		b.WriteByte('@')
	}
	b.WriteString(p.host)
	b.WriteString(webhookPath(p.host, p.path))
	if p.hasQuery {
		b.WriteString("?" + maskPairs(p.query))
	}
	if p.hasFragment {
		b.WriteByte('#')
		if strings.Contains(p.fragment, "=") {
			b.WriteString(maskPairs(p.fragment)) // #access_token=…
		} else {
			b.WriteString(p.fragment)
		}
	}
	return b.String()
}

// maskPairs masks the values of a query: a=1&b becomes a=xxxxx&xxxxx.
func maskPairs(q string) string {
	pairs := strings.Split(q, "&")
	for i, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		switch {
		case ok && v != "":
			pairs[i] = k + "=" + Mask
		case !ok && p != "":
			pairs[i] = Mask
		}
	}
	return strings.Join(pairs, "&")
}

// urlSecrets are the secrets of the URLs in s: the password, or a user
// info that may be a token, every query and fragment value, and the
// tokens in the path of a known webhook; as written and decoded.
func urlSecrets(s string) []string {
	var out []string
	add := func(v string) {
		out = append(out, v)
		if d, err := url.QueryUnescape(v); err == nil && d != v {
			out = append(out, d)
		}
	}
	for _, raw := range urlInText.FindAllString(s, -1) {
		p := splitURL(raw)
		if p.hasUserinfo {
			if _, pw, ok := strings.Cut(p.userinfo, ":"); ok {
				add(pw)
			} else {
				add(p.userinfo)
			}
		}
		for _, pairs := range []string{p.query, p.fragment} {
			for pair := range strings.SplitSeq(pairs, "&") {
				if _, v, ok := strings.Cut(pair, "="); ok {
					add(v)
				} else if p.hasQuery && pairs == p.query {
					add(pair)
				}
			}
		}
		for _, tok := range webhookTokens(p.host, p.path) {
			add(tok)
		}
	}
	return out
}

// webhooks are hosts whose URLs carry their credential in the path, after
// a prefix: each segment after it is masked.
var webhooks = map[string][]string{
	"hooks.slack.com":    {"/services/", "/workflows/", "/triggers/"},
	"discord.com":        {"/api/webhooks/"},
	"discordapp.com":     {"/api/webhooks/"},
	"canary.discord.com": {"/api/webhooks/"},
	"ptb.discord.com":    {"/api/webhooks/"},
}

// webhookPrefix is the prefix of path after which a known webhook's
// tokens are, when host is that webhook's.
func webhookPrefix(host, path string) (string, bool) {
	host, _, _ = strings.Cut(strings.ToLower(host), ":")
	for _, prefix := range webhooks[host] {
		if strings.HasPrefix(path, prefix) {
			return prefix, true
		}
	}
	return "", false
}

// webhookTokens are the segments of path after a known webhook's prefix.
func webhookTokens(host, path string) []string {
	prefix, ok := webhookPrefix(host, path)
	if !ok {
		return nil
	}
	return strings.FieldsFunc(path[len(prefix):], func(r rune) bool { return r == '/' })
}

// webhookPath is path with the tokens of a known webhook masked.
func webhookPath(host, path string) string {
	prefix, ok := webhookPrefix(host, path)
	if !ok {
		return path
	}
	segments := strings.Split(path[len(prefix):], "/")
	for i, s := range segments {
		if s != "" {
			segments[i] = Mask
		}
	}
	return prefix + strings.Join(segments, "/")
}

// Path masks the segments of a URL's path on host that may be credentials:
// the tokens of a known webhook (Slack's /services/…, Discord's
// /api/webhooks/…), and every segment that looks like a token, 16
// characters or more of letters and digits mixed (with . _ ~ + = and -).
// It is for a URL shown in an error, where an identifier masked too is
// little loss.
func Path(host, path string) string {
	path = webhookPath(host, path)
	segments := strings.Split(path, "/")
	for i, s := range segments {
		if tokenLike(s) {
			segments[i] = Mask
		}
	}
	return strings.Join(segments, "/")
}

func tokenLike(s string) bool {
	if len(s) < 16 {
		return false
	}
	var letter, digit bool
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
			letter = true
		case r >= '0' && r <= '9':
			digit = true
		case strings.ContainsRune("._~+=-%", r):
		default:
			return false
		}
	}
	return letter && digit
}

// Package redact keeps secrets out of what pgdispatch prints.
//
// A Filter masks known secrets in every byte written through its writers:
// the command wraps stdout and stderr, its logs included, in one that knows
// the secrets of the environment and the command line, and writes "xxxxx"
// in their place. Libraries echo connection strings in their errors, and
// their own redaction is best effort (jackc/pgx#1271: a password with '@',
// '/' or '%' leaks the pieces after them), so the Filter also masks each
// piece of a secret between those characters.
//
// A secret is:
//   - the whole value of a variable whose name says it holds one (PASSWORD,
//     SECRET, TOKEN, API_KEY, CREDENTIAL and the like: SMTP_PASSWORD,
//     DB_PASSWORD, HTTP_SIGNING_SECRET), and of a flag whose name does;
//   - the password of every URL in a variable or an argument (DATABASE_URL,
//     LISTEN_DATABASE_URL, RABBITMQ_URL, --database-url), in its user info
//     or its password and sslpassword query parameters, as written and
//     decoded; and the password of a key=value connection string.
//
// A URL that does not parse is read every way a parser might read it, so
// that what any of them calls the password is masked. Pieces shorter than
// minSecret are left, or every short word would be masked; a password made
// of a common word masks that word everywhere.
//
// Secrets no one configured, such as those in a job's payload or in a
// receiver's reply, are masked by what they look like: URLs masks the user
// info and query values of URLs in text (and a webhook's path tokens; Path
// those of a path shown in an error), Text those and more in free text that
// may be cut short, and Payload the values of keys such as Authorization
// in a JSON document, and its other strings as documents, forms or text.
// A peer's reply may also quote a job's own secrets in any form: Reply
// masks them (PayloadSecrets finds them, and Secrets masks them as
// written, encoded as peers encode text, and in base64) before Text.
package redact

import (
	"cmp"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// minSecret is the length below which a secret, or a piece of one, is not
// masked.
const minSecret = 4

// secretName matches the names of variables and flags that hold a secret.
var secretName = regexp.MustCompile(`(?i)(password|passwd|passphrase|secret|token|api[_-]?key|private[_-]?key|credential)`)

// pieceSeparators are the characters a URL parser may split a secret at.
const pieceSeparators = "@/%:?#&=+"

// kvPassword finds password and sslpassword in a key=value connection
// string: password=secret, password='se cret' or password=se\ cret (a
// backslash escapes the next character, quoted or not, as libpq reads it).
var kvPassword = regexp.MustCompile(`(?i)\b(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)+)`)

// kvEscape is a backslash and the character it escapes.
var kvEscape = regexp.MustCompile(`\\(.)`)

// Filter replaces secrets in what is written through its writers. Its zero
// value knows no secret.
type Filter struct {
	mu       sync.Mutex
	secrets  []string
	replacer *strings.Replacer // nil while there is no secret
}

// AddEnv adds the secrets of environment entries, NAME=value.
func (r *Filter) AddEnv(environ []string) {
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		r.addValue(name, value)
	}
}

// AddArgs adds the secrets of command-line arguments: the URLs' passwords,
// and the values of flags whose names say they hold secrets.
func (r *Filter) AddArgs(args []string) {
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case !strings.HasPrefix(a, "-"):
			r.addValue("", a)
		case hasValue:
			r.addValue(name, value)
		case secretName.MatchString(name) && i+1 < len(args):
			r.addValue(name, args[i+1])
		}
	}
}

// addValue adds the secrets of the value of a variable or flag called name.
func (r *Filter) addValue(name, value string) {
	var found []string
	if secretName.MatchString(name) {
		found = append(found, value, strings.TrimPrefix(value, "whsec_"))
	}
	found = append(found, connPasswords(value)...)
	if len(found) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range found {
		r.secrets = append(r.secrets, pieces(s)...)
		// As written in a URL, and as a URL would carry it.
		for _, form := range []string{url.PathEscape(s), url.QueryEscape(s), url.UserPassword("", s).String()[1:]} {
			if form != s {
				r.secrets = append(r.secrets, form)
			}
		}
		if d, err := url.PathUnescape(s); err == nil && d != s {
			r.secrets = append(r.secrets, d)
		}
	}
	r.secrets = slices.DeleteFunc(r.secrets, func(s string) bool { return len(s) < minSecret })
	// Longest first: a secret is masked whole before its pieces are.
	slices.SortFunc(r.secrets, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	r.secrets = slices.Compact(r.secrets)
	pairs := make([]string, 0, 2*len(r.secrets))
	for _, s := range r.secrets {
		pairs = append(pairs, s, Mask)
	}
	r.replacer = strings.NewReplacer(pairs...)
}

// pieces returns s and every run of it between two of its separators (or
// its ends): for "ab@cd/ef%gh", also "ab@cd", "cd/ef%gh", "ef" and so on.
// A parser that splits s at some of them may print any such run.
func pieces(s string) []string {
	cuts := []int{0}
	for i, c := range s {
		if strings.ContainsRune(pieceSeparators, c) {
			cuts = append(cuts, i, i+len(string(c)))
		}
	}
	cuts = append(cuts, len(s))
	var out []string
	for i := 0; i < len(cuts); i += 2 { // starts: the string's, and after each separator
		for j := i + 1; j < len(cuts); j += 2 { // ends: before each separator, and the string's
			if cuts[j] > cuts[i] {
				out = append(out, s[cuts[i]:cuts[j]])
			}
		}
	}
	return out
}

// connPasswords returns the passwords a connection string may hold, and
// those of the URLs in any other text (a JSON payload, say).
func connPasswords(s string) []string {
	var out []string
	for _, u := range urlInText.FindAllString(s, -1) {
		if u != s {
			out = append(out, connPasswords(u)...)
		}
	}
	return append(out, connStringPasswords(strings.TrimSpace(s))...)
}

// connStringPasswords returns the passwords of s read as one URL, or as a
// key=value string.
func connStringPasswords(s string) []string {
	scheme, rest, isURL := strings.Cut(s, "://")
	if !isURL || scheme == "" || strings.ContainsAny(scheme, " \t/") {
		var out []string
		for _, m := range kvPassword.FindAllStringSubmatch(s, -1) {
			written := m[1]
			if len(written) >= 2 && written[0] == '\'' {
				written = written[1 : len(written)-1]
			}
			out = append(out, written)
			if meant := kvEscape.ReplaceAllString(written, "$1"); meant != written {
				out = append(out, meant)
			}
		}
		return out
	}
	var out []string
	if u, err := url.Parse(s); err == nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw) // decoded; addValue adds it as written too
		}
		for k, vs := range u.Query() {
			if k := strings.ToLower(k); k == "password" || k == "sslpassword" {
				out = append(out, vs...)
			}
		}
	}
	// A password with an unencoded '@', '/' or '%' may still parse, as
	// another password and host: postgres://u:pa@ss/w%0rd@host. The user
	// info may end at the first '@' (as pgx reads it) or at the last one:
	// both are taken, which masks too much only when the URL has another
	// '@' after its user info.
	for _, at := range []int{strings.IndexByte(rest, '@'), strings.LastIndexByte(rest, '@')} {
		if at < 0 {
			continue
		}
		if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
			out = append(out, pw)
		}
	}
	if _, query, ok := strings.Cut(rest, "?"); ok {
		for _, pair := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(pair, "=")
			if k := strings.ToLower(k); k == "password" || k == "sslpassword" {
				out = append(out, v)
			}
		}
	}
	return out
}

// Writer returns w with the secrets masked in every Write. A secret split
// across two Writes is not recognised; fmt, zap and flag write a line or
// more at once.
func (r *Filter) Writer(w io.Writer) io.Writer { return redactingWriter{r, w} }

type redactingWriter struct {
	r *Filter
	w io.Writer
}

func (rw redactingWriter) Write(p []byte) (int, error) {
	rw.r.mu.Lock()
	replacer := rw.r.replacer
	rw.r.mu.Unlock()
	if replacer == nil {
		return rw.w.Write(p)
	}
	if _, err := io.WriteString(rw.w, replacer.Replace(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

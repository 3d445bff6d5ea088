package redact

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"html"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Secrets are values known to be secret, such as a job's credentials, to be
// masked in what a peer sends back, in the forms a peer may quote them in:
//   - as written, and base64-encoded at any offset within a longer text, as
//     in an SMTP AUTH PLAIN response (base64 of "\x00user\x00password") or
//     an HTTP Basic credential, in either alphabet;
//   - JSON-escaped, with and without HTML escaping (& < > as \u0026 \u003c
//     \u003e), once and twice (a body quoted in a JSON reply), and with '/'
//     written "\/" as PHP writes it; as Go's strconv.Quote writes it;
//     URL-encoded, as a query or a path; HTML-escaped;
//   - for a value of 16 bytes or more, every run of 12 of its bytes, so
//     that a value wrapped over lines (a page that wraps at 64 columns) is
//     masked but for at most 11 bytes at either end of each line.
//
// Its zero value, or nil, knows no secret.
type Secrets struct {
	values []string
	once   sync.Once
	// Built by the first Mask.
	forms    []string // longest first
	replacer *strings.Replacer
	windows  map[string]bool
}

// minWrapped is the length from which a secret's every window of
// wrapWindow bytes is masked, and maxWrapped the length up to which it is.
const minWrapped, maxWrapped, wrapWindow = 16, 4096, 12

// NewSecrets returns the Secrets of values. Values shorter than 4 bytes are
// left out, or every short word would be masked. Their forms are worked
// out when the first text is masked.
func NewSecrets(values ...string) *Secrets {
	return &Secrets{values: slices.DeleteFunc(slices.Clone(values), func(v string) bool { return len(v) < minSecret })}
}

func (s *Secrets) build() {
	var forms []string
	for _, v := range s.values {
		forms = append(forms, quotedForms(v)...)
		for _, b64 := range base64Cores(v) {
			if len(b64) >= minSecret {
				forms = append(forms, b64, strings.NewReplacer("+", "-", "/", "_").Replace(b64))
			}
		}
		if len(v) >= minWrapped && len(v) <= maxWrapped {
			for i := 0; i+wrapWindow <= len(v); i++ {
				if utf8.RuneStart(v[i]) && (i+wrapWindow == len(v) || utf8.RuneStart(v[i+wrapWindow])) {
					if s.windows == nil {
						s.windows = make(map[string]bool)
					}
					s.windows[v[i:i+wrapWindow]] = true
				}
			}
		}
	}
	if len(forms) == 0 {
		return
	}
	s.forms = longestFirst(forms)
	pairs := make([]string, 0, 2*len(s.forms))
	for _, f := range s.forms {
		pairs = append(pairs, f, Mask)
	}
	s.replacer = strings.NewReplacer(pairs...)
}

func longestFirst(forms []string) []string {
	slices.SortFunc(forms, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	return slices.Compact(forms)
}

// quotedForms are v as written and as the encoders a peer quotes text with
// write it.
func quotedForms(v string) []string {
	forms := []string{v}
	add := func(f string) {
		if !slices.Contains(forms, f) {
			forms = append(forms, f)
		}
	}
	add(url.QueryEscape(v))
	add(url.PathEscape(v))
	add(html.EscapeString(v))
	if q := strconv.Quote(v); len(q) >= 2 {
		add(q[1 : len(q)-1])
	}
	for _, escapeHTML := range []bool{true, false} {
		once := jsonEscape(v, escapeHTML)
		twice := jsonEscape(once, escapeHTML)
		add(once)
		add(twice)
		add(strings.ReplaceAll(once, "/", `\/`))
		add(strings.ReplaceAll(twice, "/", `\/`))
	}
	return forms
}

// plainASCII tells whether s is printable ASCII with nothing JSON or HTML
// escapes.
func plainASCII(s string) bool {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e || strings.IndexByte(`"\<>&`, c) >= 0 {
			return false
		}
	}
	return true
}

// jsonEscape is s as encoding/json writes it within a string's quotes.
func jsonEscape(s string, escapeHTML bool) string {
	if plainASCII(s) {
		return s
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\"\n")[1:]
}

// base64Cores are the runs of base64 characters that stand for v alone when
// v is encoded within a longer text, at each of the three offsets a byte
// can have within a group of three: the characters that also carry bits of
// the bytes around v are left off.
func base64Cores(v string) []string {
	cores := make([]string, 0, 3)
	for k := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, k), v...))
		start, end := (8*k+5)/6, 8*(k+len(v))/6
		cores = append(cores, enc[start:end])
	}
	return cores
}

// Mask replaces every secret in text, in each of its forms, with Mask. A
// text that ends within a secret, as an excerpt cut short does, has that
// end masked too when at least 4 bytes of the secret are in it.
func (s *Secrets) Mask(text string) string {
	if s == nil || len(s.values) == 0 {
		return text
	}
	s.once.Do(s.build)
	text = maskWindows(s.replacer.Replace(text), s.windows)
	for _, f := range s.forms {
		for n := min(len(f)-1, len(text)); n >= minSecret; n-- {
			if strings.HasSuffix(text, f[:n]) {
				return text[:len(text)-n] + Mask
			}
		}
	}
	return text
}

// maskWindows masks every run of text that is one of windows, as a
// secret's bytes wrapped over lines leave it.
func maskWindows(text string, windows map[string]bool) string {
	if len(windows) == 0 || len(text) < wrapWindow {
		return text
	}
	var (
		b    strings.Builder
		last int
	)
	for i := 0; i+wrapWindow <= len(text); {
		if !windows[text[i:i+wrapWindow]] {
			i++
			continue
		}
		b.WriteString(text[last:i])
		b.WriteString(Mask)
		i += wrapWindow
		last = i
	}
	if last == 0 {
		return text
	}
	b.WriteString(text[last:])
	return b.String()
}

// Reply masks the text of a peer's reply, or an excerpt of it: the known
// secrets, then what looks like a secret (see Text).
func Reply(text string, known *Secrets) string { return Text(known.Mask(text)) }

// PayloadSecrets returns the secret values of a job's payload, which a peer
// that echoes its request may send back: every string or number under a
// secret key (as Payload masks them: Authorization, X-Api-Key, Cookie,
// password and the like, at any depth), with the credentials of an
// Authorization value ("Bearer t" gives t, "Basic" its decoded password) and
// the values of a Cookie's pairs; in every other string, what Payload masks
// in it (a serialised document's secrets, a form's secret values, "Bearer
// t" under any key); and in every URL the password, or the token, in its
// user info, every query and fragment value, and the path tokens of a known
// webhook (see Path), as written and decoded. A payload that is not JSON
// has none.
func PayloadSecrets(raw json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var out []string
	if err := collectSecrets(dec, false, &out); err != nil && !errors.Is(err, io.EOF) {
		return nil
	}
	return out
}

func collectSecrets(dec *json.Decoder, secret bool, out *[]string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		for dec.More() {
			inner := secret
			if t == '{' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				k, _ := key.(string)
				inner = secret || secretKey(k)
			}
			if err := collectSecrets(dec, inner, out); err != nil {
				return err
			}
		}
		_, err := dec.Token() // the closing delimiter
		return err
	case string:
		*out = append(*out, stringSecrets(t, secret)...)
	case json.Number:
		if secret {
			*out = append(*out, t.String())
		}
	}
	return nil
}

// stringSecrets are the secrets of a string of a payload, as Payload masks
// them: v's own under a secret key, a document's in a string that holds
// one, the values of a form's secret keys, the credentials Text masks, and
// the secrets of the URLs in it.
func stringSecrets(v string, secret bool) []string {
	var out []string
	switch {
	case secret:
		out = valueSecrets(v)
	case nestedDocument(v):
		return PayloadSecrets(json.RawMessage(v))
	case form(v):
		pairs, secret := secretPairs(v)
		for _, i := range secret {
			_, value, _ := strings.Cut(pairs[i], "=")
			out = append(out, value)
			if d, err := url.QueryUnescape(value); err == nil && d != value {
				out = append(out, d)
			}
		}
	}
	return append(append(out, textSecrets(v)...), urlSecrets(v)...)
}

// textSecrets are the values Text masks by what they look like: the
// credentials after an authentication scheme or an SMTP AUTH command, and
// the values of key=value pairs and JSON members whose keys are secret.
func textSecrets(s string) []string {
	var out []string
	if strings.ContainsAny(s, " \t\r\n") {
		for _, re := range []*regexp.Regexp{authScheme, smtpAuth} {
			for _, m := range re.FindAllStringSubmatch(s, -1) {
				out = append(out, m[1])
			}
		}
	}
	if strings.ContainsAny(s, "=:") {
		for _, re := range []*regexp.Regexp{jsonMember, keyValue} {
			for _, m := range re.FindAllStringSubmatch(s, -1) {
				if secretKey(m[1]) {
					out = append(out, strings.Trim(m[2], `"'`))
				}
			}
		}
	}
	return out
}

// valueSecrets is v, a secret value, and the pieces of it a peer may quote
// alone: the credentials after an authentication scheme, the password a
// Basic credential holds, and the values of cookies.
func valueSecrets(v string) []string {
	out := []string{v}
	if scheme, cred, ok := strings.Cut(strings.TrimSpace(v), " "); ok {
		cred = strings.TrimSpace(cred)
		out = append(out, cred)
		if strings.EqualFold(scheme, "basic") {
			if d, err := base64.StdEncoding.DecodeString(cred); err == nil && utf8.Valid(d) {
				if _, pw, ok := strings.Cut(string(d), ":"); ok {
					out = append(out, pw)
				}
			}
		}
	}
	for pair := range strings.SplitSeq(v, ";") {
		if _, value, ok := strings.Cut(pair, "="); ok {
			out = append(out, strings.TrimSpace(value))
		}
	}
	return out
}

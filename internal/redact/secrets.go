package redact

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// Secrets are values known to be secret, such as a job's credentials, to be
// masked in what a peer sends back: as written, and base64-encoded at any
// offset within a longer text, as in an SMTP AUTH PLAIN response
// (base64 of "\x00user\x00password") or an HTTP Basic credential. Its zero
// value, or nil, knows no secret.
type Secrets struct {
	forms    []string // longest first
	replacer *strings.Replacer
}

// NewSecrets returns the Secrets of values. Values shorter than 4 bytes are
// left out, or every short word would be masked.
func NewSecrets(values ...string) *Secrets {
	var forms []string
	for _, v := range values {
		if len(v) < minSecret {
			continue
		}
		forms = append(forms, v)
		for _, b64 := range base64Cores(v) {
			if len(b64) >= minSecret {
				forms = append(forms, b64, strings.NewReplacer("+", "-", "/", "_").Replace(b64))
			}
		}
	}
	if len(forms) == 0 {
		return &Secrets{}
	}
	slices.SortFunc(forms, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	forms = slices.Compact(forms)
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, Mask)
	}
	return &Secrets{forms: forms, replacer: strings.NewReplacer(pairs...)}
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
	if s == nil || s.replacer == nil {
		return text
	}
	text = s.replacer.Replace(text)
	for _, f := range s.forms {
		for n := min(len(f)-1, len(text)); n >= minSecret; n-- {
			if strings.HasSuffix(text, f[:n]) {
				return text[:len(text)-n] + Mask
			}
		}
	}
	return text
}

// Reply masks the text of a peer's reply, or an excerpt of it: the known
// secrets, then what looks like a secret (see Text).
func Reply(text string, known *Secrets) string { return Text(known.Mask(text)) }

// PayloadSecrets returns the secret values of a job's payload, which a peer
// that echoes its request may send back: every string or number under a
// secret key (as Payload masks them: Authorization, X-Api-Key, Cookie,
// password and the like, at any depth), with the credentials of an
// Authorization value ("Bearer t" gives t, "Basic" its decoded password) and
// the values of a Cookie's pairs; and the password, or the token, in the
// user info of every URL, and the values of its query parameters whose
// names are secret keys. A payload that is not JSON has none.
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
		if secret {
			*out = append(*out, valueSecrets(t)...)
		}
		*out = append(*out, urlSecrets(t)...)
	case json.Number:
		if secret {
			*out = append(*out, t.String())
		}
	}
	return nil
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

// urlSecrets are the secrets of the URLs in s.
func urlSecrets(s string) []string {
	var out []string
	for _, raw := range urlInText.FindAllString(s, -1) {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw)
		} else if u.User != nil {
			out = append(out, u.User.Username()) // a token
		}
		for k, vs := range u.Query() {
			if secretKey(k) {
				out = append(out, vs...)
			}
		}
	}
	return out
}

package redact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Mask is what stands in place of a secret.
const Mask = "xxxxx"

// urlInText finds URLs in free text: a scheme, "://" and what follows up
// to a space or a quote.
var urlInText = regexp.MustCompile("[A-Za-z][A-Za-z0-9+.-]*://[^\\s\"'<>`]+")

// URLs masks the user info and the query and fragment values of every URL
// in s: https://bob:pw@host/p?token=t becomes
// https://bob:xxxxx@host/p?token=xxxxx. A user info without a password may
// be a token, and is masked whole.
func URLs(s string) string {
	return urlInText.ReplaceAllStringFunc(s, maskURL)
}

func maskURL(u string) string {
	scheme, rest, _ := strings.Cut(u, "://")
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		user, _, hasPassword := strings.Cut(authority[:at], ":")
		if hasPassword {
			authority = user + ":" + Mask + authority[at:]
		} else {
			authority = Mask + authority[at:]
		}
	}
	path, fragment, hasFragment := strings.Cut(tail, "#")
	path, query, hasQuery := strings.Cut(path, "?")
	var b strings.Builder
	b.WriteString(scheme + "://" + authority + path)
	if hasQuery {
		b.WriteString("?" + maskPairs(query))
	}
	if hasFragment {
		b.WriteByte('#')
		if strings.Contains(fragment, "=") {
			fragment = maskPairs(fragment) // #access_token=…
		}
		b.WriteString(fragment)
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

// secretKeyParts are what a key's name contains, lower-cased and with
// everything but letters and digits dropped, when its value is a secret:
// Authorization, X-Api-Key, password_hash, client_secret, refresh_token,
// Cookie, X-Hub-Signature and the like. secretKeys are whole names.
var (
	secretKeyParts = []string{
		"authorization", "password", "passwd", "passphrase", "secret", "token", "apikey", "accesskey",
		"privatekey", "authkey", "subscriptionkey", "cookie", "signature", "credential", "sessionid", "bearer",
	}
	secretKeys = map[string]bool{"auth": true, "pass": true, "pwd": true}
)

func secretKey(k string) bool {
	var b strings.Builder
	for _, r := range strings.ToLower(k) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	n := b.String()
	if secretKeys[n] {
		return true
	}
	for _, p := range secretKeyParts {
		if strings.Contains(n, p) {
			return true
		}
	}
	return false
}

// Payload returns the JSON document raw with every string and number under
// a secret key (at any depth) replaced by "xxxxx", and the URLs in every
// other string masked by URLs. Keys keep their order.
func Payload(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		return raw, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var out bytes.Buffer
	if err := maskValue(dec, &out, false); err != nil {
		return nil, fmt.Errorf("mask payload: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("mask payload: more than one JSON value")
	}
	return out.Bytes(), nil
}

func maskValue(dec *json.Decoder, out *bytes.Buffer, secret bool) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t != '{' && t != '[' {
			return fmt.Errorf("unexpected %q", t)
		}
		out.WriteByte(byte(t))
		for first := true; dec.More(); first = false {
			if !first {
				out.WriteByte(',')
			}
			inner := secret
			if t == '{' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				k, _ := key.(string)
				writeString(out, k)
				out.WriteByte(':')
				inner = secret || secretKey(k)
			}
			if err := maskValue(dec, out, inner); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return err
		}
		if t == '{' {
			out.WriteByte('}')
		} else {
			out.WriteByte(']')
		}
	case string:
		if secret {
			t = Mask
		}
		writeString(out, URLs(t))
	case json.Number:
		if secret {
			writeString(out, Mask)
		} else {
			out.WriteString(t.String())
		}
	case bool:
		out.WriteString(strconv.FormatBool(t))
	case nil:
		out.WriteString("null")
	}
	return nil
}

func writeString(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a string always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}

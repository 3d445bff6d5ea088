package redact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
)

// Mask is what stands in place of a secret.
const Mask = "xxxxx"

// secretKeyParts are what a key's name contains, lower-cased and with
// everything but letters and digits dropped, when its value is a secret:
// Authorization, X-Api-Key, password_hash, client_secret, refresh_token,
// Cookie, X-Hub-Signature, X-JWT-Assertion and the like; secretKeyEnds are
// how it ends (x-functions-key, DD-APPLICATION-KEY, X-Session, otp), and
// secretKeys are whole names (X-Auth, sig). notSecretKeys end as secret
// names do and are not: a message's routing key, a public key.
var (
	secretKeyParts = []string{
		"authorization", "password", "passwd", "passphrase", "secret", "token", "apikey", "accesskey",
		"privatekey", "authkey", "subscriptionkey", "cookie", "signature", "credential", "sessionid", "bearer", "jwt",
	}
	secretKeyEnds = []string{"key", "session", "otp"}
	secretKeys    = map[string]bool{"auth": true, "xauth": true, "pass": true, "pwd": true, "sig": true, "sas": true}
	notSecretKeys = map[string]bool{
		"routingkey": true, "idempotencykey": true, "publickey": true, "partitionkey": true, "sortkey": true,
		"primarykey": true, "foreignkey": true, "cachekey": true, "dedupkey": true, "deduplicationkey": true,
		"groupkey": true, "objectkey": true, "messagekey": true, "hotkey": true,
	}
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
	if notSecretKeys[n] {
		return false
	}
	for _, p := range secretKeyParts {
		if strings.Contains(n, p) {
			return true
		}
	}
	for _, e := range secretKeyEnds {
		if strings.HasSuffix(n, e) {
			return true
		}
	}
	return false
}

// Payload returns the JSON document raw with every string and number under
// a secret key (at any depth) replaced by "xxxxx", and every other string
// masked: one that holds a JSON object or array, such as a request body
// already serialised, is masked as a document; one that reads as a form
// (a=1&client_secret=s) has the values of its secret keys masked; and then
// each is masked by Text (the URLs' secrets, "Bearer t" under any key).
// Keys keep their order.
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
		writeString(out, maskString(t, secret))
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

// maskString masks a string of a payload, found under a secret key or not.
func maskString(s string, secret bool) string {
	switch {
	case secret:
		return Mask
	case nestedDocument(s):
		// A document with nothing to mask keeps its layout.
		var compact bytes.Buffer
		if masked, err := Payload(json.RawMessage(s)); err == nil &&
			(json.Compact(&compact, []byte(s)) != nil || !bytes.Equal(masked, compact.Bytes())) {
			return string(masked)
		}
	case form(s):
		s = maskForm(s)
	}
	return Text(s)
}

// nestedDocument tells whether s is a JSON object or array.
func nestedDocument(s string) bool {
	s = strings.TrimSpace(s)
	return len(s) >= 2 && (s[0] == '{' || s[0] == '[') && json.Valid([]byte(s))
}

// form tells whether s reads as an application/x-www-form-urlencoded form:
// one or more key=value pairs, with no space.
func form(s string) bool {
	if !strings.Contains(s, "=") || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	_, err := url.ParseQuery(s)
	return err == nil
}

// secretPairs returns the pairs of the form s, and the indexes of those
// whose key, decoded, is a secret key and whose value is not empty.
func secretPairs(s string) (pairs []string, secret []int) {
	pairs = strings.Split(s, "&")
	for i, pair := range pairs {
		k, v, _ := strings.Cut(pair, "=")
		if key, err := url.QueryUnescape(k); err == nil && secretKey(key) && v != "" {
			secret = append(secret, i)
		}
	}
	return pairs, secret
}

// maskForm masks the values of the secret keys of the form s.
func maskForm(s string) string {
	pairs, secret := secretPairs(s)
	for _, i := range secret {
		k, _, _ := strings.Cut(pairs[i], "=")
		pairs[i] = k + "=" + Mask
	}
	return strings.Join(pairs, "&")
}

func writeString(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a string always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}

// Package signing holds the secrets that sign http_callback requests per
// Standard Webhooks: a Keyring of the secrets in force, which the
// executor signs with, and a Refresher that keeps it filled from a
// schema's signing_secrets table as operators rotate them.
//
// Every secret in force signs each request, the newest first: during a
// rotation's overlap a request carries a signature by the new secret and
// one by each old one, and a receiver that knows any of them accepts it.
package signing

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// Prefix starts a secret in its text form, as Standard Webhooks writes it.
const Prefix = "whsec_"

// The bounds of a secret's length in bytes, as the signing_secrets table
// checks them, and the length of one that Generate makes.
const (
	MinSecretBytes      = 16
	MaxSecretBytes      = 64
	GeneratedSecretSize = 32
)

// Secret is a signing key. It prints as "[secret]", whatever the verb,
// and is "[secret]" in JSON and text encodings, so that a value logged,
// formatted or encoded by mistake shows nothing of it.
type Secret []byte

func (Secret) String() string   { return "[secret]" }
func (Secret) GoString() string { return "[secret]" }

// Format writes "[secret]" for every verb, %d and %x as much as %v.
func (Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, "[secret]") }

// MarshalText is "[secret]": encoding/json, and zap's reflection, write
// that rather than the bytes' base64.
func (Secret) MarshalText() ([]byte, error) { return []byte("[secret]"), nil }

// Text is the secret's text form: Prefix and the base64 of its bytes. It
// is what a receiver is given.
func (s Secret) Text() string { return Prefix + base64.StdEncoding.EncodeToString(s) }

// ParseSecret reads a secret in its text form, base64 optionally prefixed
// with Prefix. Its error never quotes the text.
func ParseSecret(text string) (Secret, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(text), Prefix))
	if err != nil || len(key) == 0 {
		return nil, errors.New("the signing secret must be base64, optionally prefixed " + Prefix)
	}
	return key, nil
}

// Generate returns a new random secret of GeneratedSecretSize bytes.
func Generate() Secret {
	s := make(Secret, GeneratedSecretSize)
	_, _ = rand.Read(s) // crypto/rand.Read never fails
	return s
}

// Sign is the Standard Webhooks v1 signature of a message: the base64 of
// HMAC-SHA256(secret, id.timestamp.body).
func Sign(secret Secret, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Verify reports whether header, a webhook-signature header of
// space-separated "v1,<signature>" items, holds the v1 signature of the
// message by secret.
func Verify(secret Secret, header, id, timestamp string, body []byte) bool {
	want := []byte(Sign(secret, id, timestamp, body))
	for _, item := range strings.Fields(header) {
		if sig, ok := strings.CutPrefix(item, "v1,"); ok && hmac.Equal([]byte(sig), want) {
			return true
		}
	}
	return false
}

// Key is a secret of the signing_secrets table.
type Key struct {
	ID     int64
	Secret Secret
	// ExpiresAt is when it stops signing; zero: not set.
	ExpiresAt time.Time
}

// Keyring holds the secrets in force. It is safe for concurrent use; the
// zero value holds none.
type Keyring struct {
	mu      sync.Mutex
	keys    []Key // newest first
	changed chan struct{}
	timer   *time.Timer
}

// NewKeyring returns an empty Keyring.
func NewKeyring() *Keyring { return &Keyring{} }

// Set replaces the keyring's secrets with keys, kept newest (highest id)
// first. Each one leaves the keyring when it expires, by this machine's
// clock.
func (k *Keyring) Set(keys []Key) {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, func(a, b Key) int { return cmp.Compare(b.ID, a.ID) })
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = keys
	k.expire(time.Now())
}

// expire drops the expired keys, tells the waiters, and arms the timer
// for the next expiry. k.mu is held.
func (k *Keyring) expire(now time.Time) {
	k.keys = slices.DeleteFunc(k.keys, func(key Key) bool { return !key.ExpiresAt.IsZero() && !now.Before(key.ExpiresAt) })
	if k.changed != nil {
		close(k.changed)
		k.changed = nil
	}
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
	var next time.Time
	for _, key := range k.keys {
		if !key.ExpiresAt.IsZero() && (next.IsZero() || key.ExpiresAt.Before(next)) {
			next = key.ExpiresAt
		}
	}
	if !next.IsZero() {
		k.timer = time.AfterFunc(next.Sub(now), func() {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.expire(time.Now())
		})
	}
}

// MaxSigners is the most secrets that sign a request: each adds about 50
// bytes to its webhook-signature header, and rotations more often than
// their overlap would otherwise grow it past what receivers accept (8 KB
// of headers is a common limit), failing every request.
const MaxSigners = 8

// Secrets returns the secrets in force at now, newest first, at most
// MaxSigners of them.
func (k *Keyring) Secrets(now time.Time) []Secret {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Secret, 0, min(len(k.keys), MaxSigners))
	for _, key := range k.keys {
		if len(out) == MaxSigners {
			break
		}
		if key.ExpiresAt.IsZero() || now.Before(key.ExpiresAt) {
			out = append(out, key.Secret)
		}
	}
	return out
}

// IDs returns the ids of the secrets in the keyring, newest first.
func (k *Keyring) IDs() []int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	ids := make([]int64, len(k.keys))
	for i, key := range k.keys {
		ids[i] = key.ID
	}
	return ids
}

// Changed returns a channel that is closed at the keyring's next change:
// a Set, or a secret's expiry.
func (k *Keyring) Changed() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.changed == nil {
		k.changed = make(chan struct{})
	}
	return k.changed
}

// Stop stops the keyring's timer: its secrets no longer leave it when
// they expire, though Secrets still leaves them out.
func (k *Keyring) Stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
}

package signing_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdispatch/pgdispatch/signing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A secret shows nothing of itself when formatted, and a text that does
// not parse is not quoted in the error.
func TestSecretIsNeverFormatted(t *testing.T) {
	t.Parallel()
	s := signing.Generate()
	require.Len(t, s, signing.GeneratedSecretSize)
	key := signing.Key{ID: 1, Secret: s}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%q"} {
		out := fmt.Sprintf(verb, key) + fmt.Sprintf(verb, s)
		require.NotContains(t, out, s.Text()[len(signing.Prefix):], verb)
		require.NotContains(t, out, fmt.Sprintf("%x", []byte(s)), verb)
	}
	parsed, err := signing.ParseSecret(" " + s.Text() + "\n")
	require.NoError(t, err)
	require.Equal(t, s, parsed)
	_, err = signing.ParseSecret("whsec_Not!Base64")
	require.ErrorContains(t, err, "must be base64")
	require.NotContains(t, err.Error(), "Not!Base64")
}

// Sign is Standard Webhooks' v1 signature: the specification's own
// library verifies it, and Verify finds it among others.
func TestSignAsStandardWebhooks(t *testing.T) {
	t.Parallel()
	s, other := signing.Generate(), signing.Generate()
	now := time.Now()
	ts := fmt.Sprint(now.Unix())
	body := []byte(`{"order": 42}`)
	wh, err := standardwebhooks.NewWebhook(s.Text())
	require.NoError(t, err)
	want, err := wh.Sign("msg_1", now, body)
	require.NoError(t, err)
	require.Equal(t, want, "v1,"+signing.Sign(s, "msg_1", ts, body))
	header := "v1," + signing.Sign(other, "msg_1", ts, body) + " " + want
	require.True(t, signing.Verify(s, header, "msg_1", ts, body))
	require.True(t, signing.Verify(other, header, "msg_1", ts, body))
	require.False(t, signing.Verify(signing.Generate(), header, "msg_1", ts, body))
	require.False(t, signing.Verify(s, header, "msg_1", ts, []byte(`{"order": 43}`)))
}

// The keyring holds the secrets newest first, leaves out the expired
// ones, and says when one expires.
func TestKeyringExpires(t *testing.T) {
	t.Parallel()
	k := signing.NewKeyring()
	t.Cleanup(k.Stop)
	old, current := signing.Generate(), signing.Generate()
	now := time.Now()
	ends := now.Add(50 * time.Millisecond)
	changed := k.Changed()
	k.Set([]signing.Key{{ID: 1, Secret: old, ExpiresAt: ends}, {ID: 2, Secret: current}, {ID: 0, Secret: signing.Generate(), ExpiresAt: now}})
	<-changed
	require.Equal(t, []int64{2, 1}, k.IDs())
	require.Equal(t, []signing.Secret{current, old}, k.Secrets(now))
	require.Equal(t, []signing.Secret{current}, k.Secrets(ends), "a secret stops signing at its end")
	for {
		changed := k.Changed()
		if slices.Equal(k.IDs(), []int64{2}) {
			break
		}
		<-changed
	}
	require.Equal(t, []signing.Secret{current}, k.Secrets(time.Now()))
}

// A secret shows nothing of itself under the verbs that format bytes as
// numbers, nor as JSON, which zap.Any writes a struct holding one as.
func TestSecretIsNeverEncoded(t *testing.T) {
	t.Parallel()
	s := signing.Generate()
	key := signing.Key{ID: 1, Secret: s}
	for _, verb := range []string{"%d", "%o", "%b", "%c", "%U", "%08d"} {
		out := fmt.Sprintf(verb, key) + fmt.Sprintf(verb, s)
		require.NotContains(t, out, fmt.Sprint(int(s[0]))+" "+fmt.Sprint(int(s[1])), verb)
		require.Contains(t, out, "[secret]", verb)
	}
	out, err := json.Marshal(key)
	require.NoError(t, err)
	require.NotContains(t, string(out), s.Text()[len(signing.Prefix):])
	require.Contains(t, string(out), `"[secret]"`)
}

// However many secrets are in force, at most MaxSigners of them sign, the
// newest: rotations more often than their overlap leave dozens in force,
// and a header with a signature for each would pass what receivers accept.
func TestAtMostMaxSignersSign(t *testing.T) {
	t.Parallel()
	k := signing.NewKeyring()
	t.Cleanup(k.Stop)
	var keys []signing.Key
	var newest []signing.Secret
	for id := int64(1440); id >= 1; id-- {
		s := signing.Generate()
		keys = append(keys, signing.Key{ID: id, Secret: s, ExpiresAt: time.Now().Add(time.Hour)})
		if len(newest) < signing.MaxSigners {
			newest = append(newest, s)
		}
	}
	k.Set(keys)
	require.Len(t, k.IDs(), 1440)
	require.Equal(t, newest, k.Secrets(time.Now()))
}

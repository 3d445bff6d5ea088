package demo

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/signing"
)

// The receiver's "signature verified" means something: a request signed
// with another secret, or not at all, or whose body changed, is refused.
func TestDemoReceiverRefusesForgedWebhooks(t *testing.T) {
	t.Parallel()
	got := newReceipts()
	secret := signing.Generate().Text()
	r, err := startWebhookReceiver(got)
	require.NoError(t, err)
	t.Cleanup(r.close)
	require.NoError(t, r.accept(secret))

	post := func(jobID int64, signWith string, body, sent []byte) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, r.URL+"/orders", bytes.NewReader(sent))
		require.NoError(t, err)
		req.Header.Set("Pgdispatch-Job-Id", strconv.FormatInt(jobID, 10))
		req.Header.Set("Pgdispatch-Attempt", "1")
		if signWith != "" {
			now := time.Now()
			var sigs []string
			for _, s := range strings.Fields(signWith) { // each secret signs
				wh, err := standardwebhooks.NewWebhook(s)
				require.NoError(t, err)
				sig, err := wh.Sign("msg_1", now, body)
				require.NoError(t, err)
				sigs = append(sigs, sig)
			}
			req.Header.Set("Webhook-Id", "msg_1")
			req.Header.Set("Webhook-Timestamp", strconv.FormatInt(now.Unix(), 10))
			req.Header.Set("Webhook-Signature", strings.Join(sigs, " "))
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	body := []byte(`{"order_id": 1}`)
	require.Equal(t, http.StatusNoContent, post(1, secret, body, body))
	text, ok := got.get(1, 1, 0)
	require.True(t, ok)
	require.Equal(t, `POST /orders, signature verified, body {"order_id":1}`, text)

	for id, c := range map[int64]struct{ secret, sent string }{
		2: {signing.Generate().Text(), string(body)}, // another secret
		3: {"", string(body)},                        // unsigned
		4: {secret, `{"order_id": 1000000}`},         // the body changed on the way
	} {
		require.Equal(t, http.StatusUnauthorized, post(id, c.secret, body, []byte(c.sent)), "job %d", id)
		text, ok := got.get(id, 1, 0)
		require.True(t, ok)
		require.Contains(t, text, "POST /orders refused with 401: the signature does not verify")
	}

	// A rotation: the receiver accepts the new secret too, and a request
	// signed by either.
	next := signing.Generate().Text()
	require.NoError(t, r.accept(next))
	require.Equal(t, http.StatusNoContent, post(5, next, body, body))
	require.Equal(t, http.StatusNoContent, post(6, secret, body, body))
	text, ok = got.get(6, 1, 0)
	require.True(t, ok)
	require.Equal(t, `POST /orders, signature verified, body {"order_id":1}`, text)
	require.Equal(t, http.StatusNoContent, post(7, secret+" "+next, body, body))
	text, ok = got.get(7, 1, 0)
	require.True(t, ok)
	require.Equal(t, `POST /orders, signatures by all 2 secrets it knows verified, body {"order_id":1}`, text)
}

package pgdispatch_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
	"github.com/pgdispatch/pgdispatch/signing"
)

// hold stops a receiver's requests from the at-th on until released, and
// says when slots of them wait: then no other request is being signed.
type hold struct {
	at      int
	waiting int
	full    chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHold(at int) *hold {
	return &hold{at: at, full: make(chan struct{}), release: make(chan struct{})}
}

func (h *hold) open() { h.once.Do(func() { close(h.release) }) }

// rotationReceiver accepts a request that a secret it allows signed, and
// notes which of the two secrets signed each.
type rotationReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	old, new signing.Secret
	allowed  []signing.Secret
	switched bool // the overlap ended before the request came
	seen     int
	holds    []*hold
	rejected int
	// byOld and byNew: whether each request, by arrival, carried a
	// signature by the old and the new secret; afterOverlap: whether it
	// came once the test saw the overlap end.
	byOld, byNew, afterOverlap []bool
}

func (rc *rotationReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id, ts, sig := r.Header.Get("Webhook-Id"), r.Header.Get("Webhook-Timestamp"), r.Header.Get("Webhook-Signature")
	rc.mu.Lock()
	rc.seen++
	rc.byOld = append(rc.byOld, signing.Verify(rc.old, sig, id, ts, body))
	rc.byNew = append(rc.byNew, signing.Verify(rc.new, sig, id, ts, body))
	rc.afterOverlap = append(rc.afterOverlap, rc.switched)
	for _, h := range rc.holds {
		if rc.seen >= h.at {
			select {
			case <-h.release:
				continue
			default:
			}
			if h.waiting++; h.waiting == slots {
				close(h.full)
			}
			rc.mu.Unlock()
			<-h.release
			rc.mu.Lock()
		}
	}
	ok := slices.ContainsFunc(rc.allowed, func(s signing.Secret) bool { return signing.Verify(s, sig, id, ts, body) })
	if !ok {
		rc.rejected++
	}
	rc.mu.Unlock()
	if !ok {
		http.Error(w, "no signature by a secret this receiver knows", http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (rc *rotationReceiver) allow(secrets ...signing.Secret) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.allowed = secrets
}

// slots is the worker's concurrency in TestRotationWhileJobsAreInFlight.
const slots = 16

// The signing secret is rotated while 1,000 jobs are in flight to a
// receiver that accepts either secret during the overlap and only the new
// one after: no delivery is rejected, and after the overlap only the new
// secret signs.
func TestRotationWhileJobsAreInFlight(t *testing.T) {
	t.Parallel()
	const (
		jobs    = 1000
		overlap = 5 * time.Second
	)
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	a := admin.New(pool, schema, 10*time.Second)

	rc := &rotationReceiver{old: signing.Generate(), new: signing.Generate()}
	rc.Server = httptest.NewServer(rc)
	t.Cleanup(rc.Close)
	rc.allow(rc.old)
	first, second := newHold(200), newHold(200+2*slots)
	rc.holds = []*hold{first, second}
	defer first.open() // on a failure
	defer second.open()

	// The secret the worker starts with.
	oldRotation, err := a.RotateSigningSecret(ctx, rc.old, 0)
	require.NoError(t, err)

	keyring := signing.NewKeyring()
	exec, err := httpcallback.New(httpcallback.Config{Keyring: keyring, AllowNetworks: []string{httpcallback.NetworksLoopback}})
	require.NoError(t, err)
	registry := executors.NewRegistry()
	registry.Register(httpcallback.Kind, exec)
	cfg := pgdispatch.Config{
		Pool: pool, Schema: schema, WorkerID: "rotation", Registry: registry, SigningKeys: keyring, Logger: zaptest.NewLogger(t),
	}
	cfg.Concurrency = slots
	cfg.PollInterval = time.Hour
	workertest.Run(ctx, t, cfg)

	_, err = pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+` (kind, payload, max_attempts)
SELECT 'http_callback', jsonb_build_object('url', $1::text, 'data', jsonb_build_object('n', n)), 1
FROM generate_series(1, $2) AS n`, rc.URL, jobs)
	require.NoError(t, err)

	// Every slot waits in the receiver, signed by the old secret: the
	// receiver learns the new one, and the operator rotates.
	waitClosed(t, first.full, "the first hold")
	rc.allow(rc.old, rc.new)
	rotation, err := a.RotateSigningSecret(ctx, rc.new, overlap)
	require.NoError(t, err)
	wait.On(t, waitFor, "the worker to read the new secret", func() (bool, <-chan struct{}) {
		changed := keyring.Changed()
		return slices.Equal(keyring.IDs(), []int64{rotation.ID, oldRotation.ID}), changed
	})
	first.open()

	// The next requests were signed during the overlap.
	waitClosed(t, second.full, "the second hold")
	inOverlap := slices.Contains(keyring.IDs(), oldRotation.ID)
	wait.On(t, waitFor+overlap, "the overlap to end", func() (bool, <-chan struct{}) {
		changed := keyring.Changed()
		return slices.Equal(keyring.IDs(), []int64{rotation.ID}), changed
	})
	rc.mu.Lock()
	rc.allowed = []signing.Secret{rc.new}
	rc.switched = true
	rc.mu.Unlock()
	second.open()

	pgtest.WaitSQL(t, time.Minute, "every job done",
		"SELECT count(*) FILTER (WHERE status = 'done') = $1 FROM "+pgx.Identifier{schema, "jobs"}.Sanitize(), jobs)

	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Zero(t, rc.rejected, "deliveries rejected")
	require.Len(t, rc.byOld, jobs, "one request a job")
	for i := range rc.byOld {
		switch {
		case i < first.at-1+slots:
			require.True(t, rc.byOld[i] && !rc.byNew[i], "request %d, before the rotation, signed by the old secret alone", i+1)
		case i < second.at-1+slots:
			require.True(t, rc.byNew[i], "request %d, after the rotation, signed by the new secret", i+1)
			if inOverlap && i >= second.at-1 {
				require.True(t, rc.byOld[i], "request %d, in the overlap, signed by the old secret too", i+1)
			}
		default:
			require.True(t, rc.afterOverlap[i])
			require.True(t, rc.byNew[i] && !rc.byOld[i], "request %d, after the overlap, signed by the new secret alone", i+1)
		}
	}
	if !inOverlap {
		t.Logf("the overlap of %s ended before the second hold filled: its requests' signatures by the old secret went unchecked", overlap)
	}
}

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(waitFor):
		t.Fatalf("timed out after %s waiting for %s", waitFor, what)
	}
}

// A rotation while the worker's listener is away reaches the worker when
// the listener connects again.
func TestRotationWhileTheListenerIsAway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	app := "pgdispatch-listener-" + b.schema
	cfg.ListenConnConfig = pgtest.Pool(t).Config().ConnConfig.Copy()
	cfg.ListenConnConfig.RuntimeParams["application_name"] = app
	pgdispatch.SetReconnect(&cfg, 500*time.Millisecond, 500*time.Millisecond)
	cfg.SigningKeys = signing.NewKeyring()
	start(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.Positive(t, pgtest.TerminateApp(ctx, t, app))
	r, err := admin.New(pgtest.Pool(t), b.schema, 0).RotateSigningSecret(ctx, signing.Generate(), time.Hour)
	require.NoError(t, err)
	wait.On(t, waitFor, "the worker to read the new secret", func() (bool, <-chan struct{}) {
		changed := cfg.SigningKeys.Changed()
		return slices.Equal(cfg.SigningKeys.IDs(), []int64{r.ID}), changed
	})
}

// A worker that cannot read the signing secrets does not start: it would
// sign with none, and every receiver would refuse its requests.
func TestWorkerThatCannotReadTheSecretsDoesNotStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := createRoles(t)
	applyRolesScript(t, b.schema, r)
	_, err := pgtest.Pool(t).Exec(context.Background(), "REVOKE SELECT ON "+pgx.Identifier{b.schema, "signing_secrets"}.Sanitize()+
		" FROM "+pgx.Identifier{r.worker}.Sanitize())
	require.NoError(t, err)
	cfg := b.config(t, "w-no-secrets")
	cfg.Pool = rolePool(t, r.worker)
	cfg.SigningKeys = signing.NewKeyring()
	w, err := pgdispatch.NewWorker(cfg)
	require.NoError(t, err)
	err = w.Run(context.Background())
	require.ErrorContains(t, err, "read the signing secrets")
	require.ErrorContains(t, err, "run docs/roles.sql again")
}

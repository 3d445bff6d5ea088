package endpoints_test

import (
	"context"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// An endpoint is the URL's scheme, lowercased host and port, the
// default port filled in, without user info, path or query.
func TestOf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://Hooks.Example.com/a/b?token=s3cret": "https://hooks.example.com:443",
		"http://user:pw@example.com:8080/x":          "http://example.com:8080",
		"HTTP://example.com./":                       "http://example.com:80",
		"https://[::1]/":                             "https://[::1]:443",
		"https://[0:0::1]:0443/":                     "https://[::1]:443",
		"https://[::FFFF:7f00:1]/":                   "https://127.0.0.1:443",
		"https://example.com:00080/":                 "https://example.com:80",
		"https://bücher.EXAMPLE/":                    "https://xn--bcher-kva.example:443",
		"https://xn--bcher-kva.example./":            "https://xn--bcher-kva.example:443",
		"https://my_host.internal/":                  "https://my_host.internal:443",
	} {
		u, err := url.Parse(in)
		require.NoError(t, err)
		require.Equal(t, want, endpoints.Of(u), in)
	}
}

type bundle struct {
	schema string
	cfg    endpoints.Config
}

func setup(t *testing.T) bundle {
	t.Helper()
	schema := pgtest.Schema(t)
	return bundle{schema: schema, cfg: endpoints.Config{
		DB: pgtest.Pool(t), Schema: schema, MinAttempts: 4, FailureRatio: 0.5, CoolDown: time.Hour, MaxCoolDown: 3 * time.Hour,
		Logger: zaptest.NewLogger(t),
	}}
}

func (b bundle) state(t *testing.T, endpoint string) (state string, attempts, failures int, coolDown *time.Duration) {
	t.Helper()
	err := pgtest.Pool(t).QueryRow(context.Background(), "SELECT state, attempts, failures, cool_down FROM "+
		pgx.Identifier{b.schema, "endpoints"}.Sanitize()+" WHERE endpoint = $1", endpoint).Scan(&state, &attempts, &failures, &coolDown)
	require.NoError(t, err)
	return state, attempts, failures, coolDown
}

// The outcomes counted are written in one flush; a closed endpoint opens
// when its failures reach the ratio of at least MinAttempts, not before,
// and the breaker that wrote them knows at once.
func TestFlushOpensPastTheThreshold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	br, err := endpoints.New(b.cfg)
	require.NoError(t, err)

	const down, up = "http://down:80", "http://up:80"
	// A host no table row can hold is not counted, and does not keep the
	// others' outcomes from being written.
	long := "http://" + strings.Repeat("h", endpoints.MaxEndpoint) + ":80"
	br.Record(long, true, "HTTP 503 Service Unavailable")
	for range 3 {
		br.Record(down, true, "HTTP 503 Service Unavailable")
		br.Record(up, false, "")
	}
	require.NoError(t, br.Flush(ctx))
	state, attempts, failures, _ := b.state(t, down)
	require.Equal(t, []any{"closed", 3, 3}, []any{state, attempts, failures}, "fewer attempts than MinAttempts")

	br.Record(down, false, "")
	br.Record(up, false, "")
	require.NoError(t, br.Flush(ctx))
	state, _, _, coolDown := b.state(t, down)
	require.Equal(t, "open", state)
	require.Equal(t, time.Hour, *coolDown)
	require.Equal(t, "open", br.State(down))
	state, attempts, failures, _ = b.state(t, up)
	require.Equal(t, []any{"closed", 4, 0}, []any{state, attempts, failures})
	require.Equal(t, "closed", br.State(up))

	// Another worker reads it; its jobs wait for the cool-down.
	other, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	require.NoError(t, other.Load(ctx))
	require.Equal(t, "open", other.State(down))
	a := other.Admit(ctx, down, time.Minute)
	require.False(t, a.Probe)
	require.Greater(t, a.Wait, 59*time.Minute)
	require.Equal(t, endpoints.Admission{}, other.Admit(ctx, up, time.Minute))
}

// After the cool-down exactly one of many asking takes the probe; the
// others wait for it. A failed probe opens the endpoint again with the
// cool-down doubled; a probe not reported in its time goes to the next to
// ask; a probe that succeeds closes the endpoint.
func TestOneProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const down = "http://down:80"
	table := pgx.Identifier{b.schema, "endpoints"}.Sanitize()
	open := func(coolDown time.Duration) {
		_, err := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+table+` (endpoint, state, opened_at, open_until, cool_down)
VALUES ($1, 'open', now(), now(), make_interval(secs => $2))
ON CONFLICT (endpoint) DO UPDATE SET state = 'open', open_until = now(), cool_down = excluded.cool_down`, down, coolDown.Seconds())
		require.NoError(t, err)
	}
	open(time.Hour)

	const workers = 8
	breakers := make([]*endpoints.Breaker, workers)
	for i := range breakers {
		var err error
		breakers[i], err = endpoints.New(b.cfg)
		require.NoError(t, err)
		require.NoError(t, breakers[i].Load(ctx))
	}
	admissions := make([]endpoints.Admission, workers)
	var wg sync.WaitGroup
	for i, br := range breakers {
		wg.Go(func() { admissions[i] = br.Admit(ctx, down, time.Minute) })
	}
	wg.Wait()
	prober := -1
	for i, a := range admissions {
		if a.Probe {
			require.Equal(t, -1, prober, "a second probe")
			prober = i
		} else {
			require.Positive(t, a.Wait)
		}
	}
	require.NotEqual(t, -1, prober, "no probe")
	state, _, _, _ := b.state(t, down)
	require.Equal(t, "half_open", state)

	// The probe fails: open again, twice as long.
	require.NoError(t, breakers[prober].ProbeDone(ctx, down, admissions[prober], true, "HTTP 503"))
	state, _, _, coolDown := b.state(t, down)
	require.Equal(t, "open", state)
	require.Equal(t, 2*time.Hour, *coolDown)
	require.Equal(t, "open", breakers[prober].State(down))

	// A probe whose worker died: the next after its time takes it.
	open(2 * time.Hour)
	require.NoError(t, breakers[0].Load(ctx))
	require.NoError(t, breakers[1].Load(ctx))
	stale, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	require.NoError(t, stale.Load(ctx))
	first := breakers[0].Admit(ctx, down, time.Minute)
	require.True(t, first.Probe)
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+table+" SET probe_until = now() WHERE endpoint = $1", down)
	require.NoError(t, err)
	a := breakers[1].Admit(ctx, down, time.Minute)
	require.True(t, a.Probe)

	// It succeeds: closed, the cool-down kept, doubled up to MaxCoolDown,
	// for an opening soon after (TestFlappingEndpointOpensForLonger).
	require.NoError(t, breakers[1].ProbeDone(ctx, down, a, false, ""))
	state, _, _, coolDown = b.state(t, down)
	require.Equal(t, "closed", state)
	require.Equal(t, 3*time.Hour, *coolDown)
	require.Equal(t, "closed", breakers[1].State(down))
	require.Equal(t, endpoints.Admission{}, breakers[1].Admit(ctx, down, time.Minute))
	// The first prober's late report changes nothing.
	require.NoError(t, breakers[0].ProbeDone(ctx, down, first, true, "late"))
	state, _, _, _ = b.state(t, down)
	require.Equal(t, "closed", state)
	// A stale cache learns it is closed on asking.
	require.Equal(t, "open", stale.State(down))
	require.Equal(t, endpoints.Admission{}, stale.Admit(ctx, down, time.Minute))
	require.Equal(t, "closed", stale.State(down))
}

// An endpoint that fails again soon after its probe closed it opens for
// twice its last cool-down, up to MaxCoolDown, rather than the setting's:
// a receiver that answers its probes but fails under its backlog opens
// and closes less often each time. Once MaxCoolDown has passed since the
// close, it opens for the setting's again.
func TestFlappingEndpointOpensForLonger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const down = "http://flap:80"
	table := pgx.Identifier{b.schema, "endpoints"}.Sanitize()
	br, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	fail := func() {
		t.Helper()
		for range b.cfg.MinAttempts {
			br.Record(down, true, "HTTP 503 Service Unavailable")
		}
		require.NoError(t, br.Flush(ctx))
		require.Equal(t, "open", br.State(down))
	}
	heal := func() {
		t.Helper()
		_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+table+" SET open_until = now() WHERE endpoint = $1", down)
		require.NoError(t, err)
		require.NoError(t, br.Load(ctx))
		a := br.Admit(ctx, down, time.Minute)
		require.True(t, a.Probe)
		require.NoError(t, br.ProbeDone(ctx, down, a, false, ""))
		require.Equal(t, "closed", br.State(down))
	}
	openFor := func() time.Duration {
		t.Helper()
		var open time.Duration
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT open_until - opened_at FROM "+table+" WHERE endpoint = $1", down).Scan(&open))
		return open
	}

	fail()
	require.Equal(t, time.Hour, openFor(), "the first opening: the setting's cool-down")
	heal()
	fail()
	require.Equal(t, 2*time.Hour, openFor(), "open again soon after the close: twice as long")
	a := br.Admit(ctx, down, time.Minute)
	require.False(t, a.Probe)
	require.Greater(t, a.Wait, 119*time.Minute, "the breaker's jobs wait the longer cool-down")
	heal()
	fail()
	require.Equal(t, 3*time.Hour, openFor(), "up to MaxCoolDown")

	heal()
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+table+" SET cool_down_kept_until = now() WHERE endpoint = $1", down)
	require.NoError(t, err)
	fail()
	require.Equal(t, time.Hour, openFor(), "MaxCoolDown after the close: the setting's again")
}

// countingDB counts the breaker's reads of the endpoints that are not
// closed.
type countingDB struct {
	endpoints.DB
	loads atomic.Int64
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "WHERE state <> 'closed'") {
		c.loads.Add(1)
	}
	return c.DB.Query(ctx, sql, args...)
}

// While every endpoint it knows is closed or disabled, the breaker reads
// nothing between notifications, however often its refresh comes round:
// an idle worker sends nothing for it. Once one is open, it reads them
// again.
func TestRefreshOnlyWhileOneIsOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := &countingDB{DB: b.cfg.DB}
	cfg := b.cfg
	cfg.DB, cfg.RefreshInterval, cfg.FlushInterval = db, time.Millisecond, time.Millisecond
	br, err := endpoints.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- br.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	const up, down = "http://up:80", "http://down:80"
	for i := 1; i <= 5; i++ { // five flushes, each after a refresh or more
		br.Record(up, false, "")
		require.Eventually(t, func() bool {
			var attempts int
			err := pgtest.Pool(t).QueryRow(context.Background(), "SELECT coalesce(sum(attempts), 0) FROM "+
				pgx.Identifier{b.schema, "endpoints"}.Sanitize()+" WHERE endpoint = $1", up).Scan(&attempts)
			return err == nil && attempts == i
		}, 10*time.Second, time.Millisecond)
	}
	require.Zero(t, db.loads.Load(), "read the endpoints with none open")

	// A disabled endpoint changes only by a notified change: the breaker
	// that knows of one reads nothing between notifications either.
	const disabled = "http://disabled:80"
	_, err = pgtest.Pool(t).Exec(context.Background(), "SELECT "+pgx.Identifier{b.schema, "disable_endpoint"}.Sanitize()+"($1)", disabled)
	require.NoError(t, err)
	require.NoError(t, br.Load(context.Background()))
	require.Equal(t, "disabled", br.State(disabled))
	before := db.loads.Load()
	for i := 6; i <= 10; i++ {
		br.Record(up, false, "")
		require.Eventually(t, func() bool {
			var attempts int
			err := pgtest.Pool(t).QueryRow(context.Background(), "SELECT coalesce(sum(attempts), 0) FROM "+
				pgx.Identifier{b.schema, "endpoints"}.Sanitize()+" WHERE endpoint = $1", up).Scan(&attempts)
			return err == nil && attempts == i
		}, 10*time.Second, time.Millisecond)
	}
	require.Equal(t, before, db.loads.Load(), "read the endpoints with only a disabled one")

	for range 4 {
		br.Record(down, true, "HTTP 503 Service Unavailable")
	}
	require.Eventually(t, func() bool { return br.State(down) == "open" }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return db.loads.Load() > 0 }, 10*time.Second, time.Millisecond,
		"never read the endpoints with one open")
}

// A probe that outlived its time and was given to another reports too
// late: its outcome changes nothing, and the probe in flight decides.
func TestLateProbeChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const down = "http://down:80"
	_, err := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+pgx.Identifier{b.schema, "endpoints"}.Sanitize()+
		` (endpoint, state, opened_at, open_until, cool_down) VALUES ($1, 'open', now(), now(), interval '1 hour')`, down)
	require.NoError(t, err)
	first, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	second, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	require.NoError(t, first.Load(ctx))
	require.NoError(t, second.Load(ctx))

	late := first.Admit(ctx, down, 0) // its time ends as it takes it
	require.True(t, late.Probe)
	now := second.Admit(ctx, down, time.Hour)
	require.True(t, now.Probe)

	require.NoError(t, first.ProbeDone(ctx, down, late, true, "HTTP 503"))
	state, _, _, coolDown := b.state(t, down)
	require.Equal(t, "half_open", state, "the late probe's failure opened the endpoint")
	require.Equal(t, time.Hour, *coolDown)

	require.NoError(t, second.ProbeDone(ctx, down, now, false, ""))
	state, _, _, _ = b.state(t, down)
	require.Equal(t, "closed", state)
}

// The commands a disabled endpoint's error names run as written in a
// shell that refuses a glob matching no file (zsh's default; bash with
// failglob): an IPv6 endpoint's brackets are quoted. Each gives pgdispatch
// the endpoint, and the host:port and the time since which its jobs died
// of it.
func TestDisabledErrorCommandsRunAsWritten(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for endpoint, host := range map[string]string{
		"https://[2001:db8::1]:8443":    "[2001:db8::1]:8443",
		"http://hooks.example.com:8080": "hooks.example.com:8080",
	} {
		since := time.Date(2026, 5, 3, 2, 14, 2, 123456000, time.FixedZone("CEST", 2*3600))
		msg := endpoints.DisabledError(endpoint, since).Error()
		cmds := regexp.MustCompile(`'(pgdispatch [^']*)'`).FindAllStringSubmatch(msg, -1)
		require.Len(t, cmds, 2, msg)
		var args [][]string
		for _, c := range cmds {
			cmd := exec.Command("bash", "-O", "failglob", "-c", `printf '%s\n' `+c[1])
			cmd.Dir = t.TempDir()
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s: %s", c[1], out)
			args = append(args, strings.Fields(string(out)))
		}
		require.Equal(t, []string{"pgdispatch", "endpoints", "enable", endpoint}, args[0])
		require.Equal(t, []string{"pgdispatch", "jobs", "retry", "--all-dead", "--host", host, "--since", "2026-05-03T00:14:02.123456Z", "--yes"}, args[1])
		require.NoError(t, admin.DeadFilter{Host: host}.Validate())
		var m admin.Moment
		require.NoError(t, m.UnmarshalText([]byte(args[1][7])))
		require.True(t, since.Equal(m.At(time.Now())))
	}
}

// A cool-down kept by a worker of other settings opens the endpoint for
// the opener's bounds: at least its CoolDown, at most its MaxCoolDown. A
// worker whose cool-down is an hour does not open for the two minutes a
// worker of one minute kept, nor one whose longest is five minutes for
// the two hours a worker of an hour kept.
func TestKeptCoolDownWithinTheOpenersSettings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	table := pgx.Identifier{b.schema, "endpoints"}.Sanitize()
	for _, c := range []struct {
		endpoint       string
		closer, opener time.Duration // CoolDown; MaxCoolDown is twice it for the closer, thrice for the opener
		want           time.Duration
	}{
		{"http://short-kept:80", time.Minute, time.Hour, time.Hour},
		{"http://long-kept:80", time.Hour, time.Minute, 3 * time.Minute},
	} {
		closerCfg, openerCfg := b.cfg, b.cfg
		closerCfg.CoolDown, closerCfg.MaxCoolDown = c.closer, 2*c.closer
		openerCfg.CoolDown, openerCfg.MaxCoolDown = c.opener, 3*c.opener
		closer, err := endpoints.New(closerCfg)
		require.NoError(t, err)
		opener, err := endpoints.New(openerCfg)
		require.NoError(t, err)
		fail := func(br *endpoints.Breaker) {
			t.Helper()
			for range b.cfg.MinAttempts {
				br.Record(c.endpoint, true, "HTTP 503 Service Unavailable")
			}
			require.NoError(t, br.Flush(ctx))
			require.Equal(t, "open", br.State(c.endpoint))
		}
		fail(closer)
		_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+table+" SET open_until = now() WHERE endpoint = $1", c.endpoint)
		require.NoError(t, err)
		require.NoError(t, closer.Load(ctx))
		a := closer.Admit(ctx, c.endpoint, time.Minute)
		require.True(t, a.Probe)
		require.NoError(t, closer.ProbeDone(ctx, c.endpoint, a, false, ""))

		fail(opener)
		var open time.Duration
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT open_until - opened_at FROM "+table+" WHERE endpoint = $1", c.endpoint).Scan(&open))
		require.Equal(t, c.want, open, "%s: kept %s by a worker of %s, opened by one of %s to %s", c.endpoint, 2*c.closer, c.closer, c.opener, 3*c.opener)
	}
}

// A probe that closes an endpoint whose cool-down is NULL (opened by
// hand, as an operator may) keeps twice the setting's, as a failed probe
// doubles it, not MaxCoolDown.
func TestCloseKeepsTwiceTheSettingWhenNoCoolDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const down = "http://by-hand:80"
	table := pgx.Identifier{b.schema, "endpoints"}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+table+" (endpoint, state, opened_at, open_until) VALUES ($1, 'open', now(), now())", down)
	require.NoError(t, err)
	br, err := endpoints.New(b.cfg)
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	a := br.Admit(ctx, down, time.Minute)
	require.True(t, a.Probe)
	require.NoError(t, br.ProbeDone(ctx, down, a, false, ""))
	state, _, _, coolDown := b.state(t, down)
	require.Equal(t, "closed", state)
	require.NotNil(t, coolDown)
	require.Equal(t, 2*b.cfg.CoolDown, *coolDown)
}

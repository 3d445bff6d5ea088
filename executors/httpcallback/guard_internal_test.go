package httpcallback

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// These tests call the guard's checks directly: nothing is dialled, so the
// addresses off this machine (metadata services, private networks) are
// only ever compared, never reached.

// refusedByDefault are addresses the default networks (public only) must
// refuse, as the dialer's Control sees them.
var refusedByDefault = []string{
	// Metadata services, and zoned forms of them.
	"169.254.169.254:80", "169.254.170.2:80", "[fd00:ec2::254]:80", "[fd20:ce::254]:80",
	"100.100.100.200:80", "192.0.0.192:80", "168.63.129.16:80",
	"[fd00:ec2::254%eth0]:80", "[fe80::a9fe:a9fe%eth0]:80", "[fe80::1]:80",
	// Loopback, unspecified, RFC 1918, shared address space, this network.
	"127.0.0.1:80", "127.1.2.3:8080", "[::1]:80", "0.0.0.0:80", "0.1.2.3:80", "[::]:80",
	"10.0.0.1:80", "172.16.0.1:80", "172.31.255.255:80", "192.168.1.1:80", "100.64.0.1:80",
	"[fc00::1]:80", "[fd12:3456::1]:80",
	// IPv4-mapped, NAT64 and 6to4 forms of denied IPv4 addresses.
	"[::ffff:127.0.0.1]:80", "[::ffff:169.254.169.254]:80", "[::ffff:10.0.0.1]:80",
	"[64:ff9b::7f00:1]:80", "[64:ff9b::a9fe:a9fe]:80", "[64:ff9b::a00:1]:80",
	"[2002:7f00:1::1]:80", "[2002:a9fe:a9fe::1]:80", "[2002:a00:1::]:80",
	// Documentation, multicast, broadcast.
	"192.0.2.1:80", "[2001:db8::1]:80", "224.0.0.1:80", "255.255.255.255:80",
}

func TestGuardRefusesByDefault(t *testing.T) {
	t.Parallel()
	e, err := New(Config{})
	require.NoError(t, err)
	for _, a := range refusedByDefault {
		err := e.guard.checkDial("tcp", a, nil)
		require.ErrorContains(t, err, "refused: ", a)
	}
	for _, a := range []string{"93.184.215.14:443", "8.8.8.8:80", "[2606:4700:4700::1111]:443", "[::ffff:8.8.8.8]:80"} {
		require.NoError(t, e.guard.checkDial("tcp", a, nil), a)
	}
	require.ErrorContains(t, e.guard.checkDial("tcp", "[fe80::a9fe:a9fe%eth0]:80", nil), "has an IPv6 zone")
	require.ErrorContains(t, e.guard.checkDial("tcp", "100.100.100.200:80", nil), "cloud metadata address")
	require.ErrorContains(t, e.guard.checkDial("tcp", "10.0.0.1:80", nil),
		"refused: 10.0.0.1 is not in HTTP_ALLOW_NETWORKS (public); add a network that holds it to reach it")
}

// The same addresses in URLs are refused before any DNS or dial.
func TestGuardRefusesLiteralURLs(t *testing.T) {
	t.Parallel()
	e, err := New(Config{})
	require.NoError(t, err)
	for _, raw := range []string{
		"http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/latest/", "http://[fd20:ce::254]/",
		"http://[fd00:ec2::254%25eth0]/", "http://[fe80::a9fe:a9fe%25eth0]/", "http://100.100.100.200/",
		"http://192.0.0.192/", "http://[::ffff:a9fe:a9fe]/", "http://[64:ff9b::a9fe:a9fe]/", "http://0.0.0.0:8080/",
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		require.ErrorContains(t, e.guard.checkURL(u), "refused: ", raw)
	}
}

func TestGuardAllowNetworks(t *testing.T) {
	t.Parallel()
	check := func(networks []string, addr string) error {
		t.Helper()
		e, err := New(Config{AllowNetworks: networks})
		require.NoError(t, err)
		return e.guard.checkDial("tcp", addr, nil)
	}
	for _, c := range []struct {
		networks []string
		addr     string
		allowed  bool
	}{
		{[]string{"loopback"}, "127.0.0.1:80", true},
		{[]string{"loopback"}, "[::1]:80", true},
		{[]string{"loopback"}, "8.8.8.8:80", false}, // public is not implied
		{[]string{"public", "loopback"}, "8.8.8.8:80", true},
		{[]string{"private"}, "10.1.2.3:80", true},
		{[]string{"private"}, "[fd12::1]:80", true},
		{[]string{"private"}, "100.64.0.1:80", false},
		{[]string{"10.0.0.0/8"}, "10.9.9.9:80", true},
		{[]string{"10.0.0.5"}, "10.0.0.5:80", true},
		{[]string{"10.0.0.5"}, "10.0.0.6:80", false},
		{[]string{"10.1.2.3/8"}, "10.9.9.9:80", true}, // host bits are masked
		// Metadata addresses open only to an entry within them.
		{[]string{"private"}, "[fd00:ec2::254]:80", false},
		{[]string{"private"}, "[fd20:ce::254]:80", false},
		{[]string{"100.64.0.0/10"}, "100.100.100.200:80", false},
		{[]string{"100.64.0.0/10"}, "100.100.100.100:80", true},
		{[]string{"0.0.0.0/0", "::/0"}, "169.254.169.254:80", false},
		{[]string{"0.0.0.0/0", "::/0"}, "192.0.0.192:80", false},
		{[]string{"0.0.0.0/0", "::/0"}, "[fe80::1]:80", false},
		{[]string{"0.0.0.0/0", "::/0"}, "10.0.0.1:80", true},
		{[]string{"169.254.169.254/32"}, "169.254.169.254:80", true},
		{[]string{"169.254.0.0/16"}, "169.254.170.2:80", true},
		// Zones and the unspecified address, never.
		{[]string{"fe80::/10"}, "[fe80::1%eth0]:80", false},
		{[]string{"0.0.0.0/0", "::/0"}, "0.0.0.0:80", false},
		{[]string{"0.0.0.0/0", "::/0"}, "[::]:80", false},
		// NAT64 and 6to4 need their IPv4 address allowed too.
		{[]string{"64:ff9b::/96", "public"}, "[64:ff9b::808:808]:80", true},
		{[]string{"64:ff9b::/96", "public"}, "[64:ff9b::7f00:1]:80", false},
		{[]string{"64:ff9b::/96", "public"}, "[64:ff9b::a9fe:a9fe]:80", false},
		{[]string{"2002::/16", "public"}, "[2002:808:808::1]:80", true},
		{[]string{"2002::/16", "public"}, "[2002:a00:1::1]:80", false},
		{[]string{"2002::/16", "10.0.0.0/8"}, "[2002:a00:1::1]:80", true},
		// IPv4-mapped addresses are judged as IPv4.
		{[]string{"127.0.0.0/8"}, "[::ffff:127.0.0.1]:80", true},
		{[]string{"::1"}, "[::ffff:127.0.0.1]:80", false},
	} {
		err := check(c.networks, c.addr)
		if c.allowed {
			require.NoError(t, err, "%v %s", c.networks, c.addr)
		} else {
			require.ErrorContains(t, err, "refused: ", "%v %s", c.networks, c.addr)
		}
	}
	require.ErrorContains(t, check([]string{"64:ff9b::/96", "public"}, "[64:ff9b::7f00:1]:80"),
		"refused: 64:ff9b::7f00:1 carries the IPv4 address 127.0.0.1: 127.0.0.1 is not in HTTP_ALLOW_NETWORKS (64:ff9b::/96,public)")
	require.ErrorContains(t, check([]string{"private"}, "[fd20:ce::254]:80"),
		"refused: fd20:ce::254 is a link-local or cloud metadata address; only an HTTP_ALLOW_NETWORKS entry within fd20:ce::254/128 allows it")
}

func TestAllowHostsMatch(t *testing.T) {
	t.Parallel()
	g, err := newGuard([]string{"Hooks.Example.TEST.", "[::1]", "127.0.0.1", "*.svc.test"}, []string{"public", "loopback"})
	require.NoError(t, err)
	for raw, ok := range map[string]bool{
		"https://hooks.example.test/x":  true,
		"https://HOOKS.example.test./x": true,
		"http://[::1]:8080/":            true,
		"http://[0:0::1]/":              true,
		"http://127.0.0.1:9/":           true,
		"http://[::ffff:127.0.0.1]/":    true,
		"http://a.svc.test/":            true,
		"http://a.b.svc.test/":          true,
		"http://svc.test/":              false,
		"http://evilsvc.test/":          false,
		"http://example.test/":          false,
		"http://127.0.0.2/":             false,
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		if ok {
			require.NoError(t, g.checkURL(u), raw)
		} else {
			require.ErrorContains(t, g.checkURL(u), "is not in HTTP_ALLOW_HOSTS", raw)
		}
	}
}

func TestSameHost(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		from, to string
		same     bool
	}{
		{"http://a.test/x", "http://a.test/y", true},
		{"http://a.test/x", "http://A.TEST:80/y", true},
		{"https://a.test/x", "https://a.test:443/y", true},
		{"http://a.test/x", "https://a.test/x", true}, // an upgrade to TLS on the default ports
		{"http://a.test:8080/x", "https://a.test:8080/x", true},
		{"http://a.test:8080/x", "https://a.test/x", false},
		{"https://a.test/x", "http://a.test/x", false}, // never a downgrade
		{"http://a.test/x", "http://b.test/x", false},
		{"http://a.test/x", "http://sub.a.test/x", false},
		{"http://127.0.0.1:1000/", "http://127.0.0.1:2000/", false},
		{"http://127.0.0.1:1000/", "http://localhost:1000/", false},
		{"http://127.0.0.1/", "http://[::ffff:127.0.0.1]:80/", true},
	} {
		from, err := url.Parse(c.from)
		require.NoError(t, err)
		to, err := url.Parse(c.to)
		require.NoError(t, err)
		require.Equal(t, c.same, sameHost(from, to), "%s -> %s", c.from, c.to)
	}
}

// A redirect is checked by the guard before any dial: to a metadata
// address, to a zoned one, to another host.
func TestCheckRedirect(t *testing.T) {
	t.Parallel()
	e, err := New(Config{AllowNetworks: []string{"loopback"}})
	require.NoError(t, err)
	from, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:8080/hook", nil)
	require.NoError(t, err)
	for to, want := range map[string]string{
		"http://169.254.169.254/latest/meta-data/": "refused: 169.254.169.254 is a link-local or cloud metadata address",
		"http://[fd20:ce::254]/":                   "refused: fd20:ce::254 is a link-local or cloud metadata address",
		"http://[fe80::a9fe:a9fe%25eth0]/":         "refused: fe80::a9fe:a9fe%eth0 has an IPv6 zone",
		"http://127.0.0.1:9090/other":              "refused: redirect from http://127.0.0.1:8080 to another host, http://127.0.0.1:9090/other",
		"http://localhost:8080/hook":               "to another host",
	} {
		req, err := http.NewRequest(http.MethodPost, to, nil)
		require.NoError(t, err)
		require.ErrorContains(t, e.checkRedirect(req, []*http.Request{from}), want, to)
	}
	same, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:8080/moved", nil)
	require.NoError(t, err)
	require.NoError(t, e.checkRedirect(same, []*http.Request{from}))
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text, ünïcode ✓":       "plain text, ünïcode ✓",
		"\x1b[2J\x1b[31mred\x07":      `\x1b[2J\x1b[31mred\x07`,
		"a\r\nb\tc":                   "a  b c",
		"del\x7f c1\u009b nul\x00":    `del\x7f c1\x9b nul\x00`,
		"bidi \u202egnp.exe":          `bidi \u202egnp.exe`,
		"zero\u200bwidth":             `zero\u200bwidth`,
		"bad utf-8 \xff\xfe":          "bad utf-8 \uFFFD",
		"line\u2028separator\u00a0nb": `line\u2028separator\xa0nb`,
	} {
		require.Equal(t, want, printable(in), "%q", in)
	}
}

package httpcallback

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"

	"code.dny.dev/ssrf"
)

// Presets that Config.AllowNetworks may name beside CIDRs.
const (
	// NetworksPublic is every address outside the IANA special-purpose
	// registries, as code.dny.dev/ssrf tracks them: for IPv4 not 0/8,
	// 10/8, 100.64/10, 127/8, 169.254/16, 172.16/12, 192.0.0/24,
	// 192.168/16, the documentation, benchmarking, multicast and reserved
	// ranges; for IPv6 only global unicast (2000::/3) less its special
	// ranges, so not ::, ::1, fc00::/7, fe80::/10, NAT64 (64:ff9b::/96) nor
	// 6to4 (2002::/16).
	NetworksPublic = "public"
	// NetworksPrivate is RFC 1918 and unique local IPv6: 10.0.0.0/8,
	// 172.16.0.0/12, 192.168.0.0/16 and fc00::/7.
	NetworksPrivate = "private"
	// NetworksLoopback is 127.0.0.0/8 and ::1.
	NetworksLoopback = "loopback"
)

// DefaultAllowNetworks is Config.AllowNetworks' default: public addresses
// only.
var DefaultAllowNetworks = []string{NetworksPublic}

var presets = map[string][]netip.Prefix{
	NetworksPrivate: {
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("fc00::/7"),
	},
	NetworksLoopback: {
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("::1/128"),
	},
}

// metadataPrefixes are link-local and cloud metadata addresses. They are
// refused unless an allowed network lies inside one of them: 0.0.0.0/0,
// "private" (which holds fd00:ec2::254) or 100.64.0.0/10 (which holds
// 100.100.100.200) do not open them, 169.254.169.254/32 opens that address.
var metadataPrefixes = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),     // IPv4 link-local: the metadata of AWS, GCP, Azure, OpenStack and most others
	netip.MustParsePrefix("fe80::/10"),          // IPv6 link-local
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS instance metadata over IPv6
	netip.MustParsePrefix("fd20:ce::254/128"),   // GCP metadata over IPv6
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("192.0.0.192/32"),     // Oracle Cloud metadata
	netip.MustParsePrefix("168.63.129.16/32"),   // Azure WireServer, a public address reachable only from Azure VMs
}

// Prefixes whose addresses carry an IPv4 address the packets reach.
var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052: the last 32 bits
	sixto4 = netip.MustParsePrefix("2002::/16")    // RFC 3056: bits 16 to 48
)

// guard decides which targets http_callback may reach: the hosts of
// Config.AllowHosts by name, and the networks of Config.AllowNetworks by the
// address actually dialled.
type guard struct {
	hosts   []string // lower case, without a trailing dot; IPs in netip's form; "*.x" for subdomains
	public  bool
	allow   []netip.Prefix
	setting string // the networks as given, for refusals
	iana    *ssrf.Guardian
}

func newGuard(hosts, networks []string) (*guard, error) {
	g := &guard{iana: ssrf.New(ssrf.WithAnyPort(), ssrf.WithAnyNetwork())}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		norm, ok := normalHost(strings.TrimPrefix(h, "*."))
		if !ok || strings.ContainsAny(norm, "/%*") {
			return nil, fmt.Errorf("http_callback: allowed host %q: want a host name, an IP or *.domain", h)
		}
		if strings.HasPrefix(h, "*.") {
			norm = "*." + norm
		}
		g.hosts = append(g.hosts, norm)
	}

	if len(networks) == 0 {
		networks = DefaultAllowNetworks
	}
	var names []string
	for _, n := range networks {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" {
			continue
		}
		names = append(names, n)
		if n == NetworksPublic {
			g.public = true
			continue
		}
		if p, ok := presets[n]; ok {
			g.allow = append(g.allow, p...)
			continue
		}
		p, err := parseNetwork(n)
		if err != nil {
			return nil, fmt.Errorf("http_callback: allowed network %q: %w", n, err)
		}
		g.allow = append(g.allow, p)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("http_callback: no allowed network: name CIDRs or %s, %s or %s", NetworksPublic, NetworksPrivate, NetworksLoopback)
	}
	g.setting = strings.Join(names, ",")
	return g, nil
}

func parseNetwork(s string) (netip.Prefix, error) {
	const want = "want a CIDR such as 10.0.0.0/8, an IP, or " + NetworksPublic + ", " + NetworksPrivate + " or " + NetworksLoopback
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, fmt.Errorf("%s", want)
		}
	} else {
		a, err := netip.ParseAddr(strings.Trim(s, "[]"))
		if err != nil {
			return p, fmt.Errorf("%s", want)
		}
		if a.Zone() != "" {
			return p, fmt.Errorf("an IPv6 zone is never allowed")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return p, fmt.Errorf("write IPv4 networks in IPv4 form, such as 10.0.0.0/8")
	}
	return p.Masked(), nil
}

// normalHost is a URL's or an entry's host as hosts compare: lower case,
// without brackets or a trailing dot, and an IP in netip's form (IPv4-mapped
// addresses as IPv4). ok is false for an empty host or one with a port.
func normalHost(h string) (string, bool) {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
		return a.Unmap().String(), true
	}
	return h, h != "" && !strings.ContainsAny(h, ":[]")
}

// checkURL refuses a target before any dial: an IPv6 zone, a literal
// address outside the allowed networks, a host outside AllowHosts. It runs
// for the job's URL and on every redirect.
func (g *guard) checkURL(u *url.URL) error {
	raw := u.Hostname()
	if strings.Contains(raw, "%") {
		return &refusedError{fmt.Sprintf("refused: %s has an IPv6 zone, which is never dialled", printable(raw))}
	}
	host, ok := normalHost(raw)
	if !ok {
		return &refusedError{"refused: the URL has no host"}
	}
	a, err := netip.ParseAddr(host)
	isIP := err == nil
	if isIP {
		if err := g.checkAddr(a); err != nil {
			return err
		}
	}
	if len(g.hosts) == 0 {
		return nil
	}
	for _, h := range g.hosts {
		if h == host || !isIP && strings.HasPrefix(h, "*.") && strings.HasSuffix(host, h[1:]) {
			return nil
		}
	}
	return &refusedError{fmt.Sprintf("refused: host %q is not in HTTP_ALLOW_HOSTS", host)}
}

// checkDial is the dialer's Control: it runs after DNS resolution, for
// every address dialled, on every connection, redirects included.
func (g *guard) checkDial(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return &refusedError{"refused: unparsable address " + printable(address)}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return &refusedError{"refused: unparsable address " + printable(address)}
	}
	return g.checkAddr(a)
}

// checkAddr reports why a may not be dialled, or nil.
func (g *guard) checkAddr(a netip.Addr) error {
	if a.Zone() != "" {
		return &refusedError{fmt.Sprintf("refused: %s has an IPv6 zone, which is never dialled", a)}
	}
	a = a.Unmap()
	if a.IsUnspecified() {
		return &refusedError{fmt.Sprintf("refused: %s is the unspecified address, which reaches this machine", a)}
	}
	if i := slices.IndexFunc(metadataPrefixes, func(m netip.Prefix) bool { return m.Contains(a) }); i >= 0 {
		m := metadataPrefixes[i]
		if !slices.ContainsFunc(g.allow, func(p netip.Prefix) bool { return p.Contains(a) && p.Bits() >= m.Bits() }) {
			return &refusedError{fmt.Sprintf("refused: %s is a link-local or cloud metadata address; "+
				"only an HTTP_ALLOW_NETWORKS entry within %s allows it", a, m)}
		}
		return nil
	}
	if !g.allowed(a) {
		return &refusedError{fmt.Sprintf("refused: %s is not in HTTP_ALLOW_NETWORKS (%s); add a network that holds it to reach it", a, g.setting)}
	}
	if v4, ok := embeddedIPv4(a); ok {
		if err := g.checkAddr(v4); err != nil {
			return &refusedError{fmt.Sprintf("refused: %s carries the IPv4 address %s: %s", a, v4, strings.TrimPrefix(err.Error(), "refused: "))}
		}
	}
	return nil
}

func (g *guard) allowed(a netip.Addr) bool {
	if g.public && g.iana.SafeAddr(a) == nil {
		return true
	}
	return slices.ContainsFunc(g.allow, func(p netip.Prefix) bool { return p.Contains(a) })
}

// embeddedIPv4 returns the IPv4 address that a NAT64 or 6to4 address
// reaches.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixto4.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// origin is a URL's host and port (the scheme's default when it names
// none), as redirects and the per-host connection limit compare them.
func origin(u *url.URL) string {
	host, _ := normalHost(u.Hostname())
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return net.JoinHostPort(host, port)
}

// sameHost reports whether a redirect from one URL to the next stays on one
// host: the same name and port, or http on port 80 to https on port 443 of
// the same name. A redirect from https to http never does.
func sameHost(from, to *url.URL) bool {
	if from.Scheme == "https" && to.Scheme == "http" {
		return false
	}
	if origin(from) == origin(to) {
		return true
	}
	fromHost, _ := normalHost(from.Hostname())
	toHost, _ := normalHost(to.Hostname())
	return fromHost == toHost && from.Scheme == "http" && to.Scheme == "https" &&
		origin(from) == net.JoinHostPort(fromHost, "80") && origin(to) == net.JoinHostPort(toHost, "443")
}

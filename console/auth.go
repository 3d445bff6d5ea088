package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// A role is what a user may do: a viewer reads, an operator also acts and
// sees secrets on asking.
type role int

const (
	viewer role = iota + 1
	operator
)

// user is who sent a request.
type user struct {
	Name string
	role role
}

// Operator reports whether u may act.
func (u user) Operator() bool { return u.role == operator }

type userKey struct{}

func userOf(r *http.Request) user {
	u, _ := r.Context().Value(userKey{}).(user)
	return u
}

// MinTokenLen is the fewest bytes a token may have.
const MinTokenLen = 16

// Failed sign-ins from one address are limited to failedSignInBurst at
// once, then one per failedSignInEvery; an address past its limit is
// refused before its token is compared. Addresses are forgotten when
// more than maxSignInAddrs have failed.
const (
	failedSignInBurst = 10
	failedSignInEvery = time.Second
	maxSignInAddrs    = 10000
)

// signIns limits failed sign-ins per remote address.
type signIns struct {
	mu     sync.Mutex
	failed map[string]*rate.Limiter
}

func addrOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// wait is how long addr must wait before its next sign-in; 0 when it may
// try now.
func (l *signIns) wait(addr string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.failed[addr]
	if lim == nil {
		return 0
	}
	now := time.Now()
	if lim.TokensAt(now) >= 1 {
		return 0
	}
	return time.Duration((1 - lim.TokensAt(now)) * float64(failedSignInEvery))
}

// fail counts a failed sign-in from addr.
func (l *signIns) fail(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.failed[addr]
	if lim == nil {
		if len(l.failed) >= maxSignInAddrs {
			clear(l.failed)
		}
		if l.failed == nil {
			l.failed = map[string]*rate.Limiter{}
		}
		lim = rate.NewLimiter(rate.Every(failedSignInEvery), failedSignInBurst)
		l.failed[addr] = lim
	}
	lim.Allow()
}

// authenticate lets through requests with basic auth whose password is one
// of the tokens and whose user name is not empty: the name is who the
// actions are logged as. An address whose sign-ins failed too often is
// refused for a while.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := addrOf(r)
		if d := s.signIns.wait(addr); d > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
			http.Error(w, "too many failed sign-ins from this address: try again later", http.StatusTooManyRequests)
			return
		}
		name, password, ok := r.BasicAuth()
		var u user
		switch {
		case !ok || name == "":
		case tokenIs(password, s.cfg.OperatorToken):
			u = user{Name: name, role: operator}
		case tokenIs(password, s.cfg.ViewerToken):
			u = user{Name: name, role: viewer}
		}
		if u.role == 0 {
			if ok {
				s.signIns.fail(addr)
			}
			w.Header().Set("WWW-Authenticate", `Basic realm="pgdispatch console: your name, and the token", charset="UTF-8"`)
			http.Error(w, "sign in with your name and the console's token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	})
}

func tokenIs(got, want string) bool {
	if want == "" {
		return false
	}
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// csrfToken is the token the pages of u carry in their forms: an HMAC of
// the user's name and role under the process's random key.
func (s *Server) csrfToken(u user) string {
	m := hmac.New(sha256.New, s.csrfKey)
	m.Write([]byte{byte(u.role)})
	m.Write([]byte(u.Name))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sign is the signature of a message the console shows after an action.
func (s *Server) sign(msg string) string {
	m := hmac.New(sha256.New, s.csrfKey)
	m.Write([]byte("msg\x00"))
	m.Write([]byte(msg))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

var crossOrigin = http.NewCrossOriginProtection()

// operator lets through a POST from an operator that carries the CSRF
// token of its page and comes from the console's own origin; others get
// 403.
func (s *Server) operator(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		u := userOf(r)
		if !u.Operator() {
			http.Error(w, "a viewer may not act: sign in with the operator's token", http.StatusForbidden)
			return
		}
		if err := crossOrigin.Check(r); err != nil {
			http.Error(w, "refused: the request came from another site", http.StatusForbidden)
			return
		}
		want := s.csrfToken(u)
		if got := r.PostFormValue("csrf"); !hmac.Equal([]byte(got), []byte(want)) {
			http.Error(w, "refused: the form's CSRF token is missing or stale; reload the page", http.StatusForbidden)
			return
		}
		next(w, r)
	}
}

// securityHeaders sets a Content-Security-Policy that allows no inline
// script and nothing from another origin, and keeps the pages out of
// frames.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
			"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

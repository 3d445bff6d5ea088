// Package console serves pgdispatch's web console: the queues and workers,
// the jobs with their attempts (these kept current in the browser by
// server-sent events), the schedules and dispatch triggers, and the
// endpoints of http_callback jobs with their circuit breakers, with the
// actions of the command line (retry, cancel, snooze, delete; pause and
// resume).
//
// Every read and action goes through package admin, the same SQL as the
// commands'. Pages are rendered by html/template, which escapes every value
// from a row; the few scripts are a static file, under a Content-Security-
// Policy that allows no inline script. Every request needs HTTP basic auth:
// the user name is who the actions are logged as, and the password is the
// operator's token (actions) or the viewer's (reading only). Every action
// is a POST that carries the page's CSRF token.
//
// Live updates cost the database nothing while no browser is connected:
// the first viewer starts one listener (LISTEN on the schema's channels)
// and one loop that reads the state in one statement (admin.Live) each
// second, or sooner after a notification but never twice within half a
// second, and the last viewer to leave stops them.
package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/admin"
)

// Defaults of Config.
const (
	DefaultListen       = "127.0.0.1:8089"
	DefaultPollInterval = time.Second
	defaultMinGap       = 500 * time.Millisecond
	shutdownTimeout     = 5 * time.Second
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a Server.
type Config struct {
	// Pool runs the pages' reads and the actions. Required.
	Pool *pgxpool.Pool
	// Schema holds pgdispatch's tables. Required.
	Schema string
	// ListenConfig is where the live updates' listener connects (a session
	// of its own: past any transaction-pooling proxy). Required.
	ListenConfig *pgx.ConnConfig
	// Timeout bounds each database call. Default: admin's.
	Timeout time.Duration
	// OperatorToken and ViewerToken are the passwords of the two roles: an
	// operator may act, a viewer only read. At least one is required, and
	// each set has MinTokenLen bytes or more.
	OperatorToken, ViewerToken string
	// PollInterval is how often the live state is read while a browser is
	// connected, when no notification comes first. Default: 1s.
	PollInterval time.Duration
	// Logger receives the actions, with who did them, and errors. Default:
	// no logging.
	Logger *zap.Logger
	// EndpointEventJob is the job that an endpoint disabled or enabled
	// from the console inserts with its event, as `pgdispatch endpoints
	// disable` does (HTTP_BREAKER_EVENT_*). Default: none.
	EndpointEventJob admin.EventJob
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("console: Pool is required")
	case c.Schema == "":
		return errors.New("console: Schema is required")
	case c.ListenConfig == nil:
		return errors.New("console: ListenConfig is required")
	case c.OperatorToken == "" && c.ViewerToken == "":
		return errors.New("console: an operator or a viewer token is required")
	case c.OperatorToken != "" && c.OperatorToken == c.ViewerToken:
		return errors.New("console: the operator's and the viewer's tokens must differ")
	case c.OperatorToken != "" && len(c.OperatorToken) < MinTokenLen:
		return fmt.Errorf("console: the operator's token is %d bytes: use %d or more (a random one: openssl rand -hex 16)", len(c.OperatorToken), MinTokenLen)
	case c.ViewerToken != "" && len(c.ViewerToken) < MinTokenLen:
		return fmt.Errorf("console: the viewer's token is %d bytes: use %d or more (a random one: openssl rand -hex 16)", len(c.ViewerToken), MinTokenLen)
	}
	return nil
}

// Server is the console.
type Server struct {
	cfg     Config
	admin   *admin.Admin
	log     *zap.Logger
	pages   map[string]*template.Template
	csrfKey []byte
	signIns signIns
	hub     *hub
	handler http.Handler
	// base is the context the live updates run under: Serve's.
	base context.Context
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &Server{
		cfg:     cfg,
		admin:   admin.New(cfg.Pool, cfg.Schema, cfg.Timeout),
		log:     cfg.Logger.Named("console"),
		csrfKey: make([]byte, 32),
		base:    context.Background(),
	}
	if _, err := rand.Read(s.csrfKey); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s.pages = pages
	s.hub = newHub(s)
	s.handler = s.routes()
	return s, nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /jobs", s.jobs)
	mux.HandleFunc("GET /jobs/{id}", s.job)
	mux.HandleFunc("POST /jobs/{id}/reveal", s.operator(s.reveal))
	mux.HandleFunc("GET /schedules", s.schedules)
	mux.HandleFunc("GET /endpoints", s.endpoints)
	mux.HandleFunc("GET /events", s.events)
	mux.HandleFunc("GET /bulk", s.bulkConfirm)
	mux.HandleFunc("POST /actions/jobs", s.operator(s.jobsAction))
	mux.HandleFunc("POST /actions/bulk", s.operator(s.bulkAction))
	mux.HandleFunc("POST /actions/queues", s.operator(s.queueAction))
	mux.HandleFunc("POST /actions/schedules", s.operator(s.scheduleAction))
	mux.HandleFunc("POST /actions/endpoints", s.operator(s.endpointAction))
	return securityHeaders(s.authenticate(mux))
}

// Handler serves the console, for a server of the caller's: its live
// updates stop when the last viewer leaves. Serve serves it too.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves the console on ln until ctx is done, then shuts down.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.base = ctx
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		s.hub.wait()
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx) // the event streams end with ctx
	if err != nil {
		_ = srv.Close() // a connection not yet idle is closed
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = cmp.Or(err, serr)
	}
	s.hub.wait()
	if err != nil {
		return fmt.Errorf("console: shutdown: %w", err)
	}
	return nil
}

// Loopback reports whether addr, host:port, is on loopback, where no one
// off the machine reaches the console.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

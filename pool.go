package pgdispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaxConns is the size of a pool from NewPool unless its URL sets
// pool_max_conns. Each queue's claims, outcome writes and heartbeats run
// beside one another, and the sweeper and the metrics beside them:
// pgxpool's own default (the larger of 4 and the CPUs) would make a busy
// worker of two queues wait for connections.
const DefaultMaxConns = 10

// PoolConfig configures NewPool. The zero value of every field means its
// default.
type PoolConfig struct {
	// StatementTimeout bounds each call: the server's statement_timeout, and
	// a lock_timeout of the smaller of it and 5s, unless the URL sets them.
	// Default: DefaultStatementTimeout.
	StatementTimeout time.Duration
	// ListenURL is PostgreSQL itself, where the listener, the sleep keys and
	// migrations connect (pgdispatch run's LISTEN_DATABASE_URL). When it
	// names another server than the pool's URL (BehindPooler), the pool's
	// URL is taken to lead to a transaction-pooling proxy such as PgBouncer
	// in transaction mode: no session state outlives a transaction there,
	// and PgBouncer refuses startup parameters it does not know. Default:
	// none, the pool's URL is PostgreSQL itself.
	ListenURL string
	// SynchronousCommit is the pool's sessions' synchronous_commit: on, off,
	// local, remote_write or remote_apply, unless the URL sets it. It cannot
	// pass a transaction pooler, so behind one only on is accepted: set it on
	// pgdispatch's role instead. Default: the server's.
	SynchronousCommit string
}

var synchronousCommit = map[string]bool{"on": true, "off": true, "local": true, "remote_write": true, "remote_apply": true}

// check reports a SynchronousCommit that is not one of the server's values,
// or that a pooler would not pass.
func (cfg PoolConfig) check(behindPooler bool) error {
	sc := cfg.SynchronousCommit
	switch {
	case sc == "":
	case !synchronousCommit[sc]:
		return fmt.Errorf("invalid synchronous_commit %q: want on, off, local, remote_write or remote_apply", sc)
	case behindPooler && sc != "on":
		return fmt.Errorf("synchronous_commit=%s cannot reach the server through the transaction pooler of the URL "+
			"(the listen URL, LISTEN_DATABASE_URL, names another server): set synchronous_commit on pgdispatch's role instead "+
			"(ALTER ROLE ... SET synchronous_commit = %s)", sc, sc)
	}
	return nil
}

// NewPool connects a pool as the worker and the commands want it, and pings
// it. Every call is bounded.
//
// Directly, by a 10s connect timeout, and the server-side statement, lock
// and idle-in-transaction (60s) timeouts, unless the URL sets them, with
// pgx's default mode, which prepares each statement once per connection.
//
// Behind a pooler (cfg.ListenURL names another server) it sends no startup
// parameter but application_name
// (PgBouncer refuses the others unless its ignore_startup_parameters lists
// them), and the pool describes each statement once per connection and
// runs it unnamed (pgx's cache_describe mode, unless the URL sets
// default_query_exec_mode): a named prepared statement lives on one server
// connection, and the pooler hands the next transaction another. Each call
// stays bounded by its context, whose end makes pgx send a cancel request,
// which PgBouncer forwards.
//
// A connection is pinged before use only after 5 minutes idle: pgxpool
// pings one idle for a second, one more statement per tick of an idle
// worker, and a dead connection fails its call, which every caller retries.
//
// A proxy that refuses the startup parameters is named in the error, with
// what to set.
func NewPool(ctx context.Context, url string, cfg PoolConfig) (*pgxpool.Pool, error) {
	timeout := cmp.Or(cfg.StatementTimeout, DefaultStatementTimeout)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, ConnStringError(err)
	}
	pooled := BehindPooler(url, cfg.ListenURL)
	if err := cfg.check(pooled); err != nil {
		return nil, err
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	if !strings.Contains(url, "pool_max_conns") {
		pc.MaxConns = max(pc.MaxConns, DefaultMaxConns)
	}
	params := pc.ConnConfig.RuntimeParams
	setDefault(params, "application_name", "pgdispatch")
	if pooled {
		if !strings.Contains(url, "default_query_exec_mode") {
			pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
	} else {
		setDefault(params, "statement_timeout", strconv.FormatInt(timeout.Milliseconds(), 10))
		setDefault(params, "lock_timeout", strconv.FormatInt(min(timeout, 5*time.Second).Milliseconds(), 10))
		setDefault(params, "idle_in_transaction_session_timeout", "60000")
		if cfg.SynchronousCommit != "" {
			setDefault(params, "synchronous_commit", cfg.SynchronousCommit)
		}
	}
	pc.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > 5*time.Minute }
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, pc.ConnConfig.ConnectTimeout+timeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		if refusedStartupParameter(err) {
			return nil, fmt.Errorf("connect to database: %w (%s; see Behind PgBouncer in docs/operations.md)", err, proxyHint(cfg.ListenURL))
		}
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// proxyHint says what to do when the URL leads to a proxy that refuses
// pgdispatch's startup parameters, given the listen URL: the URL itself
// is sent them only when the listen URL is unset or names the same server.
func proxyHint(listenURL string) string {
	if listenURL != "" {
		return "the listen URL, LISTEN_DATABASE_URL, leads to a proxy such as PgBouncer, and it must lead to PostgreSQL itself, past any proxy"
	}
	return "the URL leads to a proxy such as PgBouncer, which needs a listen URL: if it pools transactions, " +
		"set LISTEN_DATABASE_URL to PostgreSQL itself, and pgdispatch sends the URL no startup parameters and prepares no statements there"
}

// refusedStartupParameter reports PgBouncer's refusal of a startup
// parameter it does not know.
func refusedStartupParameter(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "08P01" && // protocol_violation
		strings.HasPrefix(pgErr.Message, "unsupported startup parameter")
}

// BehindPooler reports whether url goes through a transaction pooler such
// as PgBouncer, given listenURL, the URL of PostgreSQL itself that the
// listener and the sleep keys use: a listen URL that names other servers
// exists to bypass one. Each URL's hosts and ports are compared as a set,
// so that a multi-host URL that lists the same servers in another order
// names the same servers.
func BehindPooler(url, listenURL string) bool {
	if listenURL == "" {
		return false
	}
	a, errA := pgconn.ParseConfig(url)
	b, errB := pgconn.ParseConfig(listenURL)
	if errA != nil || errB != nil {
		return url != listenURL
	}
	return !maps.Equal(servers(a), servers(b))
}

// servers is the set of host:port a connection config tries.
func servers(c *pgconn.Config) map[string]bool {
	set := map[string]bool{net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))): true}
	for _, f := range c.Fallbacks {
		set[net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port)))] = true
	}
	return set
}

// ConnStringError is err, from parsing a connection string
// (pgx.ParseConfig, pgxpool.ParseConfig), without the string: pgx's message
// repeats it with the password masked only as far as pgx can tell where the
// password ends, and a key=value password with an escaped space
// (password=ab\ cd) showed its tail. The reason stays, and the error under
// it, but net/url's repeats the URL, so only its own reason stays, and a
// quoted piece of the string in it (missing "=" after "cd") becomes "…".
// Any other error is returned as it is.
func ConnStringError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err
	}
	bare := *pe
	bare.ConnString = ""
	reason := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	if under := pe.Unwrap(); under != nil {
		reason = strings.TrimSuffix(reason, " ("+under.Error()+")")
		var ue *url.Error
		if errors.As(under, &ue) {
			under = ue.Err
		}
		detail := quoted.ReplaceAllStringFunc(under.Error(), func(q string) string {
			if s, err := strconv.Unquote(q); err == nil && len(s) > 1 && strings.Contains(pe.ConnString, s) {
				return `"…"`
			}
			return q
		})
		reason += " (" + detail + ")"
	}
	return fmt.Errorf("cannot parse the connection string: %s", reason)
}

// quoted matches a string quoted as %q quotes it.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

func setDefault(m map[string]string, k, v string) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

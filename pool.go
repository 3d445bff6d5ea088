package pgdispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch/claimer"
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
	// Default: claimer.DefaultStatementTimeout (10s).
	StatementTimeout time.Duration
	// BehindPooler says that the URL leads to a transaction-pooling proxy
	// such as PgBouncer in transaction mode (see BehindPooler): no session
	// state outlives a transaction there, and PgBouncer refuses startup
	// parameters it does not know.
	BehindPooler bool
	// RuntimeParams are more session settings (synchronous_commit, say),
	// unless the URL sets them; not sent behind a pooler.
	RuntimeParams map[string]string
}

// NewPool connects a pool as the worker and the commands want it, and pings
// it. Every call is bounded.
//
// Directly, by a 10s connect timeout, and the server-side statement, lock
// and idle-in-transaction (60s) timeouts, unless the URL sets them, with
// pgx's default mode, which prepares each statement once per connection.
//
// Behind a pooler it sends no startup parameter but application_name
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
func NewPool(ctx context.Context, url string, cfg PoolConfig) (*pgxpool.Pool, error) {
	timeout := cmp.Or(cfg.StatementTimeout, claimer.DefaultStatementTimeout)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, ConnStringError(err)
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if !strings.Contains(url, "pool_max_conns") {
		pc.MaxConns = max(pc.MaxConns, DefaultMaxConns)
	}
	params := pc.ConnConfig.RuntimeParams
	setDefault(params, "application_name", "pgdispatch")
	if cfg.BehindPooler {
		if !strings.Contains(url, "default_query_exec_mode") {
			pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
	} else {
		setDefault(params, "statement_timeout", strconv.FormatInt(timeout.Milliseconds(), 10))
		setDefault(params, "lock_timeout", strconv.FormatInt(min(timeout, 5*time.Second).Milliseconds(), 10))
		setDefault(params, "idle_in_transaction_session_timeout", "60000")
		for k, v := range cfg.RuntimeParams {
			setDefault(params, k, v)
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
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// BehindPooler reports whether url goes through a transaction pooler such
// as PgBouncer, given direct, the URL of PostgreSQL itself that the
// listener and the sleep keys use: a direct URL that names another host or
// port exists to bypass one.
func BehindPooler(url, direct string) bool {
	if direct == "" {
		return false
	}
	a, errA := pgconn.ParseConfig(url)
	b, errB := pgconn.ParseConfig(direct)
	if errA != nil || errB != nil {
		return url != direct
	}
	return a.Host != b.Host || a.Port != b.Port
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

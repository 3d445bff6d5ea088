package signing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/stmttimeout"
)

const (
	retryMin = time.Second
	retryMax = time.Minute
)

// DB runs the refresher's query: a pool, a connection.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// RefresherConfig configures a Refresher.
type RefresherConfig struct {
	// DB reads the table. Required.
	DB DB
	// Schema holds the signing_secrets table. Required.
	Schema string
	// Keyring is filled with the table's secrets in force. Required.
	Keyring *Keyring
	// StatementTimeout bounds each read. Default: 10s.
	StatementTimeout time.Duration
	// Logger receives the failures to read. Default: none.
	Logger *zap.Logger
}

// Refresher keeps a Keyring filled with the secrets in force of a
// schema's signing_secrets table: it reads them each time it is woken (a
// rotation notifies; a listener that connects again may have missed one).
// A read that fails is tried again, from a second up to a minute apart,
// and the keyring keeps what it held.
type Refresher struct {
	cfg    RefresherConfig
	logger *zap.Logger
	wake   chan struct{}

	mu  sync.Mutex
	ids []int64 // of the last read; nil before the first
}

// NewRefresher checks cfg and returns a Refresher.
func NewRefresher(cfg RefresherConfig) (*Refresher, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("signing: DB is required")
	case cfg.Schema == "":
		return nil, errors.New("signing: Schema is required")
	case cfg.Keyring == nil:
		return nil, errors.New("signing: Keyring is required")
	}
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, stmttimeout.Default)
	return &Refresher{
		cfg: cfg, logger: cmp.Or(cfg.Logger, zap.NewNop()).Named("signing"), wake: make(chan struct{}, 1),
	}, nil
}

// Wake asks for a read of the table. It does not block.
func (r *Refresher) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Load reads the table once into the keyring.
func (r *Refresher) Load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
	defer cancel()
	rows, _ := r.cfg.DB.Query(ctx, `SELECT id, secret, expires_at FROM `+pgx.Identifier{r.cfg.Schema, "signing_secrets"}.Sanitize()+`
WHERE expires_at IS NULL OR expires_at > now()`)
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Key, error) {
		var (
			k       Key
			expires *time.Time
		)
		err := row.Scan(&k.ID, (*[]byte)(&k.Secret), &expires)
		if expires != nil {
			k.ExpiresAt = *expires
		}
		return k, err
	})
	if err != nil {
		return fmt.Errorf("read the signing secrets: %w", describe(err))
	}
	r.cfg.Keyring.Set(keys)
	ids := r.cfg.Keyring.IDs()
	r.mu.Lock()
	changed := r.ids == nil || !slices.Equal(ids, r.ids)
	r.ids = ids
	r.mu.Unlock()
	if changed {
		r.logger.Info("signing secrets read; each signs every http_callback request", zap.Int64s("secret_ids", ids))
	} else {
		r.logger.Debug("signing secrets read", zap.Int64s("secret_ids", ids))
	}
	return nil
}

// describe says what to do about a role that may not read the table.
func describe(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("%w (grant the worker's role SELECT on signing_secrets: run docs/roles.sql again)", err)
	}
	return err
}

// Run reads the table each time the refresher is woken, until ctx is
// done. It returns nil then.
func (r *Refresher) Run(ctx context.Context) error {
	var (
		retry   *time.Timer
		retryC  <-chan time.Time
		backoff = retryMin
	)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-retryC:
		}
		if retry != nil {
			retry.Stop()
			retry, retryC = nil, nil
		}
		err := r.Load(ctx)
		if err == nil {
			backoff = retryMin
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		r.logger.Warn("signing secrets not read; the last ones read still sign", zap.Error(err), zap.Duration("retry_in", backoff))
		retry = time.NewTimer(backoff)
		retryC = retry.C
		backoff = min(2*backoff, retryMax)
	}
}

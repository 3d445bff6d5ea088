// Package listener turns PostgreSQL notifications into wake-ups.
//
// It runs pgxlisten on one dedicated connection, listening on the channel the
// jobs table's triggers notify. A notification only signals: the handler calls
// Wake with the queue name and returns. After every (re)connect it calls
// WakeAll, because notifications sent while it was disconnected are gone.
// Reconnects back off exponentially with jitter, from ReconnectMin up to
// ReconnectMax, instead of pgxlisten's fixed minute.
package listener

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/testhook"
)

const (
	defaultReconnectMin   = 100 * time.Millisecond
	defaultReconnectMax   = 10 * time.Second
	defaultConnectTimeout = 10 * time.Second
)

// Config configures a Listener.
type Config struct {
	// ConnConfig is where to connect. Required. The listener needs a session
	// of its own, so point it past any transaction-pooling proxy.
	ConnConfig *pgx.ConnConfig
	// Channel is the channel to LISTEN on. Required.
	Channel string
	// Wake is called with a notification's payload (a queue name). It must not
	// block. Required.
	Wake func(queue string)
	// WakeAll is called after every (re)connect, once LISTEN is in place.
	// It must not block. Required.
	WakeAll func()
	// ControlChannel, when set, is listened on too, and its notifications'
	// payloads go to Control, which must not block.
	ControlChannel string
	Control        func(payload string)
	// ReconnectMin and ReconnectMax bound the delay between reconnects, which
	// doubles from min to max with jitter. Defaults: 100ms and 10s.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// ConnectTimeout bounds one connection attempt, including LISTEN.
	// Default: 10s.
	ConnectTimeout time.Duration
	// OnListen, when set, is called after every successful LISTEN, after
	// WakeAll. It must not block. For health checks and tests.
	OnListen func()
	// Logger receives connection errors. Default: no logging.
	Logger *zap.Logger
}

func (c *Config) validate() error {
	switch {
	case c.ConnConfig == nil:
		return errors.New("listener: ConnConfig is required")
	case c.Channel == "":
		return errors.New("listener: Channel is required")
	case c.Wake == nil || c.WakeAll == nil:
		return errors.New("listener: Wake and WakeAll are required")
	case (c.ControlChannel == "") != (c.Control == nil):
		return errors.New("listener: ControlChannel and Control go together")
	case c.ControlChannel != "" && c.ControlChannel == c.Channel:
		return errors.New("listener: Channel and ControlChannel must differ")
	case c.ReconnectMin < 0 || c.ReconnectMax < 0:
		return errors.New("listener: reconnect delays must not be negative")
	}
	return nil
}

// Listener hears the jobs table's notifications. Create it with New.
type Listener struct {
	cfg       Config
	logger    *zap.Logger
	connected atomic.Bool
	// failures counts connection attempts since the last good connection.
	failures      atomic.Int32
	notifications atomic.Int64
	// listens counts the LISTENs in place on the current connection.
	listens atomic.Int32
}

// New checks cfg and returns a Listener.
func New(cfg Config) (*Listener, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.ReconnectMin = cmp.Or(cfg.ReconnectMin, defaultReconnectMin)
	cfg.ReconnectMax = max(cmp.Or(cfg.ReconnectMax, defaultReconnectMax), cfg.ReconnectMin)
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, defaultConnectTimeout)
	logger := cmp.Or(cfg.Logger, zap.NewNop())
	return &Listener{cfg: cfg, logger: logger.Named("listener")}, nil
}

// Connected reports whether LISTEN is in place on a live connection.
func (l *Listener) Connected() bool { return l.connected.Load() }

// Notifications counts the notifications received on Channel: the
// wake-ups. Those on ControlChannel, which every schema's functions share,
// are not counted.
func (l *Listener) Notifications() int64 { return l.notifications.Load() }

// Run listens until ctx is done, reconnecting by itself. It returns nil when
// ctx is cancelled.
func (l *Listener) Run(ctx context.Context) error {
	pl := &pgxlisten.Listener{
		Connect: l.connect,
		LogError: func(ctx context.Context, err error) {
			l.connected.Store(false)
			if ctx.Err() != nil {
				return
			}
			l.logger.Warn("listener connection lost", zap.Error(err),
				zap.Int32("failures", l.failures.Load()))
		},
		// The delay is in connect, where it can grow with each failure.
		ReconnectDelay: -1,
	}
	pl.Handle(l.cfg.Channel, handler{l: l, notified: testhook.From(ctx).Notified})
	if l.cfg.ControlChannel != "" {
		pl.Handle(l.cfg.ControlChannel, controlHandler{l})
	}
	err := pl.Listen(ctx)
	l.connected.Store(false)
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("listener: %w", err)
}

func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	l.listens.Store(0)
	if n := l.failures.Add(1); n > 1 {
		t := time.NewTimer(l.backoff(int(n - 1)))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	connectCtx, cancel := context.WithTimeout(ctx, l.cfg.ConnectTimeout)
	defer cancel()
	return pgx.ConnectConfig(connectCtx, l.cfg.ConnConfig.Copy())
}

// backoff is the delay before reconnect attempt n (n >= 1): it doubles from
// ReconnectMin, is capped at ReconnectMax, and keeps a random 50-100 % of it
// so that many workers do not reconnect in step.
func (l *Listener) backoff(n int) time.Duration {
	d := l.cfg.ReconnectMin << min(n-1, 30)
	if d <= 0 || d > l.cfg.ReconnectMax {
		d = l.cfg.ReconnectMax
	}
	return d/2 + rand.N(d/2+1) //nolint:gosec // jitter needs no crypto
}

type handler struct {
	l        *Listener
	notified func(queue string) // testhook.Hooks.Notified, nil but in tests and the bench
}

func (h handler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.l.notifications.Add(1)
	if h.notified != nil {
		h.notified(n.Payload)
	}
	h.l.cfg.Wake(n.Payload)
	return nil
}

// HandleBacklog runs after each LISTEN on every new connection. Once every
// channel is listened on, whatever was notified while no one listened is
// found by waking every claimer.
func (h handler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.l.listened()
	return nil
}

func (h controlHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.l.listened()
	return nil
}

// listened counts a LISTEN in place on the current connection, and when
// they all are, wakes every claimer.
func (l *Listener) listened() {
	channels := int32(1)
	if l.cfg.ControlChannel != "" {
		channels = 2
	}
	if l.listens.Add(1) != channels {
		return
	}
	l.failures.Store(0)
	l.connected.Store(true)
	l.logger.Info("listening", zap.String("channel", l.cfg.Channel))
	l.cfg.WakeAll()
	if l.cfg.OnListen != nil {
		l.cfg.OnListen()
	}
}

type controlHandler struct{ l *Listener }

func (h controlHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.l.cfg.Control(n.Payload)
	return nil
}

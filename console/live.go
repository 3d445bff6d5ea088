package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/listener"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// hub shares one reading of the live state among every connected browser.
// It runs only while a viewer is connected: the first one starts a
// listener on the schema's channels and a refresh loop, the last one to
// leave stops both, so that with no viewer the console sends the database
// nothing and holds no connection.
//
// The loop reads the state (one statement) when a notification comes, and
// every PollInterval without one (a job's completion notifies no one), never
// twice within defaultMinGap; it sends the state to the viewers when it
// changed.
type hub struct {
	s *Server
	// The limits of the event streams: how many at once in all and per
	// user, how long an event may take to write, how often a quiet stream
	// sends a heartbeat, and how many queues the state and the overview
	// list. Tests lower them.
	maxStreams, maxPerUser int
	writeTimeout           time.Duration
	heartbeat              time.Duration
	maxQueues              int

	mu      sync.Mutex
	viewers map[chan []byte]string // the user each stream is for
	stop    context.CancelFunc     // nil while not running
	last    []byte                 // the last state sent, nil until read
	wg      sync.WaitGroup

	wake chan struct{}
	// onStop, for tests, is called when a loop has stopped; onWrite
	// before each write to a stream (done false) and after it succeeded
	// (done true), with the bytes the stream is sent with it.
	onStop  func()
	onWrite func(total int, done bool)
}

// The event streams' limits.
const (
	defaultMaxStreams   = 100
	defaultMaxPerUser   = 10
	defaultWriteTimeout = 10 * time.Second
	defaultHeartbeat    = 15 * time.Second
	defaultMaxQueues    = 500
)

func newHub(s *Server) *hub {
	return &hub{
		s: s, viewers: map[chan []byte]string{}, wake: make(chan struct{}, 1),
		maxStreams: defaultMaxStreams, maxPerUser: defaultMaxPerUser, writeTimeout: defaultWriteTimeout,
		heartbeat: defaultHeartbeat, maxQueues: defaultMaxQueues,
	}
}

// errTooManyStreams refuses a stream past the limits.
var errTooManyStreams = errors.New("too many live update streams are open: close a tab of the console, or try again later")

// poke asks for a reading now (or at the gap's end). It never blocks.
func (h *hub) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// subscribe adds a viewer, who, starting the loop for the first one under
// ctx (the server's, not the request's), and returns the viewer's channel
// of states, which holds the latest one only, and its leave; or
// errTooManyStreams past the limits.
func (h *hub) subscribe(ctx context.Context, who string) (<-chan []byte, func(), error) {
	ch := make(chan []byte, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	mine := 0
	for _, u := range h.viewers {
		if u == who {
			mine++
		}
	}
	if len(h.viewers) >= h.maxStreams || mine >= h.maxPerUser {
		return nil, nil, errTooManyStreams
	}
	h.viewers[ch] = who
	if h.last != nil {
		ch <- h.last
	}
	if h.stop == nil {
		runCtx, stop := context.WithCancel(ctx) // the loop stops with the server too
		h.stop = stop
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.run(runCtx)
			if h.onStop != nil {
				h.onStop()
			}
		}()
	}
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.viewers, ch)
		if len(h.viewers) == 0 && h.stop != nil {
			h.stop()
			h.stop, h.last = nil, nil
		}
	}, nil
}

// running reports whether the loop runs.
func (h *hub) running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stop != nil
}

// wait waits for the loops started to return.
func (h *hub) wait() { h.wg.Wait() }

func (h *hub) run(ctx context.Context) {
	l, err := listener.New(listener.Config{
		ConnConfig:     h.s.cfg.ListenConfig.Copy(),
		Channel:        triggers.Channel(h.s.cfg.Schema),
		Wake:           func(string) { h.poke() },
		WakeAll:        h.poke,
		ControlChannel: triggers.ControlChannel,
		Control:        func(string) { h.poke() },
		Logger:         h.s.log,
	})
	if err != nil {
		h.s.log.Error("live updates: listener", zap.Error(err))
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = l.Run(ctx)
	}()
	defer wg.Wait()

	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		case <-tick.C:
		}
		read := time.Now()
		h.refresh(ctx)
		// Never twice within the gap: a burst of notifications is one read.
		gap := time.NewTimer(defaultMinGap - time.Since(read))
		select {
		case <-ctx.Done():
			gap.Stop()
			return
		case <-gap.C:
		}
		tick.Reset(h.s.cfg.PollInterval - time.Since(read))
	}
}

// liveState is what the browsers receive.
type liveState struct {
	Queues any `json:"queues"`
	// MoreQueues is how many queues past the first maxQueues are left out.
	MoreQueues int   `json:"more_queues,omitempty"`
	Workers    any   `json:"workers"`
	MaxID      int64 `json:"max_id"`
	// Error says why the state could not be read.
	Error string `json:"error,omitempty"`
}

func (h *hub) refresh(ctx context.Context) {
	l, err := h.s.admin.Live(ctx)
	if ctx.Err() != nil {
		return
	}
	st := liveState{Queues: l.Queues, Workers: l.Workers, MaxID: l.MaxID}
	h.mu.Lock()
	maxQueues := h.maxQueues
	h.mu.Unlock()
	if n := len(l.Queues); n > maxQueues {
		st.Queues, st.MoreQueues = l.Queues[:maxQueues], n-maxQueues
	}
	if err != nil {
		h.s.log.Warn("live updates: read the state", zap.Error(err))
		st = liveState{Error: "the console could not read the queues' state; it tries again"}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return
	}
	h.mu.Lock()
	changed := !bytes.Equal(b, h.last)
	if changed && h.stop != nil {
		h.last = b
		for ch := range h.viewers {
			select { // the latest state replaces one not yet sent
			case <-ch:
			default:
			}
			ch <- b
		}
	}
	h.mu.Unlock()
}

// events streams the live state to one browser as server-sent events, a
// "state" event at each change and a comment as a heartbeat when quiet.
// Each write has writeTimeout: a browser that stops reading loses its
// stream, and holds up no shutdown.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	h := s.hub
	states, leave, err := h.subscribe(s.base, userOf(r).Name)
	if err != nil {
		w.Header().Set("Retry-After", "10")
		http.Error(w, err.Error(), http.StatusTooManyRequests)
		return
	}
	defer leave()
	h.mu.Lock()
	writeTimeout, heartbeat, onWrite := h.writeTimeout, h.heartbeat, h.onWrite
	h.mu.Unlock()
	rc := http.NewResponseController(w)
	// A write in progress ends when the request does (the server's
	// shutdown included).
	stop := context.AfterFunc(r.Context(), func() { _ = rc.SetWriteDeadline(time.Now()) })
	defer stop()
	sent := 0
	write := func(format string, args ...any) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
		if r.Context().Err() != nil {
			return false
		}
		msg := fmt.Appendf(nil, format, args...)
		if sent += len(msg); onWrite != nil {
			onWrite(sent, false)
		}
		if _, err := w.Write(msg); err != nil {
			return false
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
		if onWrite != nil {
			onWrite(sent, true)
		}
		return true
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if !write(": live\n\n") {
		return
	}
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	for {
		var ok bool
		select {
		case <-r.Context().Done():
			return
		case <-beat.C:
			ok = write(": heartbeat\n\n")
		case b := <-states:
			ok = write("event: state\ndata: %s\n\n", b)
			beat.Reset(heartbeat)
		}
		if !ok {
			return
		}
	}
}

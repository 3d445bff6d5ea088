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

	mu      sync.Mutex
	viewers map[chan []byte]struct{}
	stop    context.CancelFunc // nil while not running
	last    []byte             // the last state sent, nil until read
	wg      sync.WaitGroup

	wake chan struct{}
	// onStop, for tests, is called when a loop has stopped.
	onStop func()
}

func newHub(s *Server) *hub {
	return &hub{s: s, viewers: map[chan []byte]struct{}{}, wake: make(chan struct{}, 1)}
}

// poke asks for a reading now (or at the gap's end). It never blocks.
func (h *hub) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// subscribe adds a viewer, starting the loop for the first one under ctx
// (the server's, not the request's), and returns the viewer's channel of
// states, which holds the latest one only, and its leave.
func (h *hub) subscribe(ctx context.Context) (<-chan []byte, func()) {
	ch := make(chan []byte, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.viewers[ch] = struct{}{}
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
	}
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
	Queues  any   `json:"queues"`
	Workers any   `json:"workers"`
	MaxID   int64 `json:"max_id"`
	// Error says why the state could not be read.
	Error string `json:"error,omitempty"`
}

func (h *hub) refresh(ctx context.Context) {
	l, err := h.s.admin.Live(ctx)
	if ctx.Err() != nil {
		return
	}
	st := liveState{Queues: l.Queues, Workers: l.Workers, MaxID: l.MaxID}
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
// "state" event at each change.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	states, leave := s.hub.subscribe(s.base)
	defer leave()
	for {
		select {
		case <-r.Context().Done():
			return
		case b := <-states:
			if _, err := fmt.Fprintf(w, "event: state\ndata: %s\n\n", b); err != nil {
				return
			}
			if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return
			}
		}
	}
}

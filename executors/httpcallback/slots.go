package httpcallback

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// hostSlots lets at most per requests run at once to one host (name and
// port), so that at most per connections are open to it. A job beyond that
// waits for a slot within its own timeout. Each host has its own slots: a
// host whose slots are all held by hung requests makes only its own jobs
// wait. Operators see the waits: a warning per host when jobs start to wait
// for it and a line when they stop, and the gauges and counter of Collect.
type hostSlots struct {
	per    int
	logger *zap.Logger

	mu     sync.Mutex
	hosts  map[string]*hostSlot // only hosts with a request running or waiting
	warned map[string]time.Time // when each host was last warned about

	waiting   atomic.Int64 // jobs waiting now, all hosts
	waits     atomic.Int64 // jobs that waited
	saturated atomic.Int64 // hosts with jobs waiting now
}

// warnEvery is how often at most a host's waits are logged.
const warnEvery = time.Minute

type hostSlot struct {
	held    chan struct{} // one element per request running
	users   int           // requests running or waiting, under mu; the entry goes at 0
	waiting int           // requests waiting, under mu
}

func newHostSlots(per int, logger *zap.Logger) *hostSlots {
	return &hostSlots{per: per, logger: logger, hosts: map[string]*hostSlot{}, warned: map[string]time.Time{}}
}

// busyError is a job that found no slot free for its host before its
// context ended. It is retried like a timeout.
type busyError struct {
	host  string
	per   int
	cause error
}

func (e *busyError) Error() string {
	return fmt.Sprintf("no connection to %s free before the job's timeout: all %d (HTTP_MAX_CONNECTIONS_PER_HOST) were busy: %v",
		e.host, e.per, e.cause)
}

func (e *busyError) Unwrap() error { return e.cause }

// acquire takes a slot for host, waiting for one until ctx ends. release
// gives it back.
func (s *hostSlots) acquire(ctx context.Context, host string, jobID int64) (release func(), err error) {
	s.mu.Lock()
	h := s.hosts[host]
	if h == nil {
		h = &hostSlot{held: make(chan struct{}, s.per)}
		s.hosts[host] = h
	}
	h.users++
	s.mu.Unlock()
	release = func() {
		<-h.held
		s.leave(host, h)
	}

	select {
	case h.held <- struct{}{}:
		return release, nil
	default:
	}
	s.startWait(host, h, jobID)
	defer s.endWait(h)
	select {
	case h.held <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		s.leave(host, h)
		return nil, &busyError{host: host, per: s.per, cause: context.Cause(ctx)}
	}
}

func (s *hostSlots) leave(host string, h *hostSlot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.users--; h.users == 0 {
		delete(s.hosts, host)
	}
}

// startWait counts a job that waits for host, and warns at most once per
// warnEvery and host.
func (s *hostSlots) startWait(host string, h *hostSlot, jobID int64) {
	s.waiting.Add(1)
	s.waits.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.waiting++; h.waiting == 1 {
		s.saturated.Add(1)
	}
	now := time.Now()
	if now.Sub(s.warned[host]) < warnEvery {
		return
	}
	if len(s.warned) >= 1024 {
		for k, t := range s.warned {
			if now.Sub(t) >= warnEvery {
				delete(s.warned, k)
			}
		}
	}
	s.warned[host] = now
	s.logger.Warn("http_callback jobs wait for a connection: all of the host's connections are busy",
		zap.String("host", host), zap.Int("max_connections_per_host", s.per),
		zap.Int("jobs_waiting", h.waiting), zap.Int64("job_id", jobID))
}

func (s *hostSlots) endWait(h *hostSlot) {
	s.waiting.Add(-1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.waiting--; h.waiting == 0 {
		s.saturated.Add(-1)
	}
}

var (
	descWaiting = prometheus.NewDesc("pgdispatch_http_jobs_waiting_for_connection",
		"http_callback jobs waiting now for a connection to their host, all of whose HTTP_MAX_CONNECTIONS_PER_HOST are busy.", nil, nil)
	descWaits = prometheus.NewDesc("pgdispatch_http_connection_waits_total",
		"http_callback jobs that had to wait for a connection to their host.", nil, nil)
	descSaturated = prometheus.NewDesc("pgdispatch_http_hosts_saturated",
		"Hosts whose HTTP_MAX_CONNECTIONS_PER_HOST are all busy with http_callback jobs waiting for them.", nil, nil)
)

// Describe implements prometheus.Collector.
func (e *Executor) Describe(ch chan<- *prometheus.Desc) {
	ch <- descWaiting
	ch <- descWaits
	ch <- descSaturated
	if e.breaker != nil {
		e.breaker.Describe(ch)
	}
}

// Collect implements prometheus.Collector: the waits for the per-host
// connection limit, and the breaker's events (see endpoints.Breaker's
// Collect). They carry no host label, because hosts come from
// untrusted payloads; the warnings in the log name them.
func (e *Executor) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(e.slots.waiting.Load()))
	ch <- prometheus.MustNewConstMetric(descWaits, prometheus.CounterValue, float64(e.slots.waits.Load()))
	ch <- prometheus.MustNewConstMetric(descSaturated, prometheus.GaugeValue, float64(e.slots.saturated.Load()))
	if e.breaker != nil {
		e.breaker.Collect(ch) // the events of the endpoints' circuits
	}
}

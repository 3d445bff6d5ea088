package admin

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/redact"
)

// Endpoint is a receiver of http_callback jobs and its circuit breaker, as
// the endpoints table holds it (see package endpoints).
type Endpoint struct {
	// Endpoint is the scheme, host and port: https://example.com:443.
	Endpoint string `json:"endpoint"`
	// State is closed (requests go), open (jobs wait until OpenUntil) or
	// half_open (one probe is in flight until ProbeUntil).
	State string `json:"state"`
	// Attempts and Failures are the closed endpoint's outcomes in the
	// window that began at WindowStartedAt.
	Attempts        int       `json:"attempts"`
	Failures        int       `json:"failures"`
	WindowStartedAt time.Time `json:"window_started_at"`
	// OpenedAt is when the circuit opened, until it closes again.
	OpenedAt  *time.Time `json:"opened_at"`
	OpenUntil *time.Time `json:"open_until"`
	// CoolDown is how long it stays open this time.
	CoolDown        time.Duration `json:"-"`
	CoolDownSeconds float64       `json:"cool_down_seconds,omitempty"`
	ProbeUntil      *time.Time    `json:"probe_until"`
	// Reason is the last failure counted before it opened, redacted as
	// last_error is, and masked again when read (redact.Text): a row the
	// workers did not write shows no secret either.
	Reason    string    `json:"reason,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

const endpointColumns = `endpoint, state, attempts, failures, window_started_at, opened_at, open_until,
       coalesce(extract(epoch FROM cool_down), 0)::float8, probe_until, coalesce(reason, ''), updated_at`

func scanEndpoint(row pgx.CollectableRow) (Endpoint, error) {
	var e Endpoint
	err := row.Scan(&e.Endpoint, &e.State, &e.Attempts, &e.Failures, &e.WindowStartedAt, &e.OpenedAt, &e.OpenUntil,
		&e.CoolDownSeconds, &e.ProbeUntil, &e.Reason, &e.UpdatedAt)
	e.CoolDown = time.Duration(e.CoolDownSeconds * float64(time.Second))
	e.Reason = redact.Text(e.Reason)
	return e, err
}

// Endpoints lists the endpoints, those that are not closed first, then by
// name.
func (a *Admin) Endpoints(ctx context.Context) ([]Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`SELECT `+endpointColumns+`
FROM {schema}.endpoints
ORDER BY state = 'closed', endpoint`))
	out, err := pgx.CollectRows(rows, scanEndpoint)
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return out, nil
}

// EndpointOf returns the endpoint of j, an http_callback job, as the
// executor finds it: the payload's url read by the executor's rules, its
// scheme, host and port (endpoints.Of). It returns "" for a job of another
// kind, or whose url the executor would refuse.
func EndpointOf(j Job) string {
	if j.Kind != httpcallback.Kind {
		return ""
	}
	u, err := httpcallback.PayloadURL(j.Payload)
	if err != nil {
		return ""
	}
	return endpoints.Of(u)
}

// EndpointsHolding returns the endpoints that hold back jobs among jobs:
// for each pending http_callback job whose endpoint is open or half-open,
// that endpoint, by the job's id. Read the jobs' payloads before masking
// them. It sends one statement, and none when no job is a pending
// http_callback job.
func (a *Admin) EndpointsHolding(ctx context.Context, jobs []Job) (map[int64]*Endpoint, error) {
	byJob := map[int64]string{}
	var names []string
	for _, j := range jobs {
		if j.Status != "pending" {
			continue
		}
		if e := EndpointOf(j); e != "" {
			byJob[j.ID] = e
			names = append(names, e)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	slices.Sort(names)
	names = slices.Compact(names)
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`SELECT `+endpointColumns+`
FROM {schema}.endpoints
WHERE endpoint = ANY($1) AND state <> 'closed'`), names)
	list, err := pgx.CollectRows(rows, scanEndpoint)
	if err != nil {
		return nil, fmt.Errorf("read the jobs' endpoints: %w", err)
	}
	notClosed := make(map[string]*Endpoint, len(list))
	for i := range list {
		notClosed[list[i].Endpoint] = &list[i]
	}
	held := map[int64]*Endpoint{}
	for id, name := range byJob {
		if e := notClosed[name]; e != nil {
			held[id] = e
		}
	}
	return held, nil
}

// Until is when e's state ends: open_until while it is open, probe_until
// while it is half-open; nil while it is closed.
func (e Endpoint) Until() *time.Time {
	switch e.State {
	case "open":
		return e.OpenUntil
	case "half_open":
		return e.ProbeUntil
	}
	return nil
}

// EndpointsNotClosed counts the endpoints that are open and those that are
// half-open.
func (a *Admin) EndpointsNotClosed(ctx context.Context) (open, halfOpen int, err error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	err = a.pool.QueryRow(ctx, a.sql(`SELECT count(*) FILTER (WHERE state = 'open'), count(*) FILTER (WHERE state = 'half_open')
FROM {schema}.endpoints WHERE state <> 'closed'`)).Scan(&open, &halfOpen)
	if err != nil {
		return 0, 0, fmt.Errorf("count the endpoints not closed: %w", err)
	}
	return open, halfOpen, nil
}

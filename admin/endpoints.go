package admin

import (
	"context"
	"encoding/json"
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
	Reason string `json:"reason,omitempty"`
	// DisabledAt is when it was disabled, by the breaker (open too long)
	// or an operator (DisabledBy): its jobs fail until it is enabled.
	DisabledAt *time.Time `json:"disabled_at"`
	DisabledBy string     `json:"disabled_by,omitempty"`
	// Note is the operator's.
	Note      string    `json:"note,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

const endpointColumns = `endpoint, state, attempts, failures, window_started_at, opened_at, open_until,
       coalesce(extract(epoch FROM CASE WHEN state <> 'closed' THEN cool_down END), 0)::float8, probe_until, coalesce(reason, ''),
       disabled_at, coalesce(disabled_by, ''), coalesce(note, ''), updated_at`

func scanEndpoint(row pgx.CollectableRow) (Endpoint, error) {
	var e Endpoint
	err := row.Scan(&e.Endpoint, &e.State, &e.Attempts, &e.Failures, &e.WindowStartedAt, &e.OpenedAt, &e.OpenUntil,
		&e.CoolDownSeconds, &e.ProbeUntil, &e.Reason, &e.DisabledAt, &e.DisabledBy, &e.Note, &e.UpdatedAt)
	e.CoolDown = time.Duration(e.CoolDownSeconds * float64(time.Second))
	e.Reason = redact.Text(e.Reason)
	return e, err
}

// Endpoints lists the endpoints, the disabled first, then those that are
// not closed, then by name.
func (a *Admin) Endpoints(ctx context.Context) ([]Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`SELECT `+endpointColumns+`
FROM {schema}.endpoints
ORDER BY disabled_at IS NULL, state = 'closed', endpoint`))
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
// for each pending http_callback job whose endpoint is open, half-open or
// disabled (its job is dead, unsent, when next claimed), that endpoint, by
// the job's id. Read the jobs' payloads before masking them. It sends one
// statement, and none when no job is a pending http_callback job.
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
WHERE endpoint = ANY($1) AND (state <> 'closed' OR disabled_at IS NOT NULL)`), names)
	list, err := pgx.CollectRows(rows, scanEndpoint)
	if err != nil {
		return nil, fmt.Errorf("read the jobs' endpoints: %w", err)
	}
	holding := make(map[string]*Endpoint, len(list))
	for i := range list {
		holding[list[i].Endpoint] = &list[i]
	}
	held := map[int64]*Endpoint{}
	for id, name := range byJob {
		if e := holding[name]; e != nil {
			held[id] = e
		}
	}
	return held, nil
}

// Until is when e's state ends: open_until while it is open, probe_until
// while it is half-open; nil while it is closed or disabled (no probe
// goes).
func (e Endpoint) Until() *time.Time {
	if e.DisabledAt != nil {
		return nil
	}
	switch e.State {
	case "open":
		return e.OpenUntil
	case "half_open":
		return e.ProbeUntil
	}
	return nil
}

// EndpointCount counts the endpoints that hold back jobs: those disabled,
// and, of the others, those open and those half-open.
type EndpointCount struct {
	Disabled, Open, HalfOpen int
}

// EndpointCounts counts the endpoints disabled, open and half-open (a
// disabled endpoint counts as disabled only).
func (a *Admin) EndpointCounts(ctx context.Context) (EndpointCount, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var c EndpointCount
	err := a.pool.QueryRow(ctx, a.sql(`SELECT count(*) FILTER (WHERE disabled_at IS NOT NULL),
       count(*) FILTER (WHERE disabled_at IS NULL AND state = 'open'),
       count(*) FILTER (WHERE disabled_at IS NULL AND state = 'half_open')
FROM {schema}.endpoints WHERE state <> 'closed' OR disabled_at IS NOT NULL`)).Scan(&c.Disabled, &c.Open, &c.HalfOpen)
	if err != nil {
		return EndpointCount{}, fmt.Errorf("count the endpoints disabled or not closed: %w", err)
	}
	return c, nil
}

// EventJob is the job an operator's change of an endpoint inserts with its
// event (endpoint_event in SQL): none when Kind is empty. Queue empty is
// default; Payload, a JSON object, empty is {}.
type EventJob struct {
	Kind, Queue string
	Payload     json.RawMessage
}

func (j EventJob) args() []any {
	var kind, queue, payload *string
	if j.Kind != "" {
		kind = &j.Kind
	}
	if j.Queue != "" {
		queue = &j.Queue
	}
	if len(j.Payload) > 0 {
		p := string(j.Payload)
		payload = &p
	}
	return []any{kind, queue, payload}
}

// DisableEndpoint disables endpoint (disable_endpoint() in SQL): its jobs
// fail, dead, until EnableEndpoint. note, when not empty, replaces its
// note. It reports whether the endpoint was not disabled already.
func (a *Admin) DisableEndpoint(ctx context.Context, endpoint, note string, job EventJob) (bool, error) {
	return a.endpointCall(ctx, "disable", `SELECT {schema}.disable_endpoint($1, $2, $3, $4, $5::jsonb)`,
		append([]any{endpoint, note}, job.args()...)...)
}

// EnableEndpoint enables a disabled endpoint and closes its circuit
// (enable_endpoint() in SQL). It reports whether the endpoint was
// disabled.
func (a *Admin) EnableEndpoint(ctx context.Context, endpoint string, job EventJob) (bool, error) {
	return a.endpointCall(ctx, "enable", `SELECT {schema}.enable_endpoint($1, $2, $3, $4::jsonb)`,
		append([]any{endpoint}, job.args()...)...)
}

// SetEndpointNote sets endpoint's note; "" clears it (set_endpoint_note()
// in SQL).
func (a *Admin) SetEndpointNote(ctx context.Context, endpoint, note string) error {
	_, err := a.endpointCall(ctx, "note", `SELECT {schema}.set_endpoint_note($1, $2) IS NULL`, endpoint, note)
	return err
}

func (a *Admin) endpointCall(ctx context.Context, what, sql string, args ...any) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var changed bool
	if err := a.pool.QueryRow(ctx, a.sql(sql), args...).Scan(&changed); err != nil {
		return false, fmt.Errorf("%s endpoint %s: %w", what, args[0], err)
	}
	return changed, nil
}

// EndpointEvent is a row of endpoint_events: an endpoint's circuit opened
// (from closed), closed (a probe succeeded), or it was disabled or
// enabled.
type EndpointEvent struct {
	ID       int64     `json:"id"`
	Endpoint string    `json:"endpoint"`
	Event    string    `json:"event"`
	At       time.Time `json:"at"`
	// By is breaker or operator; Role the database role that wrote it.
	By   string `json:"by"`
	Role string `json:"role"`
	// Reason is the last failure before it, redacted as last_error is.
	Reason string `json:"reason,omitempty"`
	Note   string `json:"note,omitempty"`
	// JobID is the job that tells of it, if one was asked for.
	JobID *int64 `json:"job_id,omitempty"`
}

// EndpointEvents lists the newest limit events, of endpoint when not
// empty, newest first.
func (a *Admin) EndpointEvents(ctx context.Context, endpoint string, limit int) ([]EndpointEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`
SELECT id, endpoint, event, at, actor, by_role, coalesce(reason, ''), coalesce(note, ''), job_id
FROM {schema}.endpoint_events
WHERE $1 = '' OR endpoint = $1
ORDER BY id DESC
LIMIT $2`), endpoint, limit)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (EndpointEvent, error) {
		var e EndpointEvent
		err := row.Scan(&e.ID, &e.Endpoint, &e.Event, &e.At, &e.By, &e.Role, &e.Reason, &e.Note, &e.JobID)
		e.Reason = redact.Text(e.Reason)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list endpoint events: %w", err)
	}
	return out, nil
}

package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
	// last_error is.
	Reason    string    `json:"reason,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Endpoints lists the endpoints, those that are not closed first, then by
// name.
func (a *Admin) Endpoints(ctx context.Context) ([]Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`
SELECT endpoint, state, attempts, failures, window_started_at, opened_at, open_until,
       coalesce(extract(epoch FROM cool_down), 0)::float8, probe_until, coalesce(reason, ''), updated_at
FROM {schema}.endpoints
ORDER BY state = 'closed', endpoint`))
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Endpoint, error) {
		var e Endpoint
		err := row.Scan(&e.Endpoint, &e.State, &e.Attempts, &e.Failures, &e.WindowStartedAt, &e.OpenedAt, &e.OpenUntil,
			&e.CoolDownSeconds, &e.ProbeUntil, &e.Reason, &e.UpdatedAt)
		e.CoolDown = time.Duration(e.CoolDownSeconds * float64(time.Second))
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return out, nil
}

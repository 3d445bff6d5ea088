package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/signing"
)

// The executors' settings, for run.
var executorSettings = []settings.Setting{
	{Env: "HTTP_SIGNING_SECRET", Help: "sign `http_callback` requests per Standard Webhooks with this base64 secret too (`whsec_` prefix optional), after the secrets of `pgdispatch secrets rotate`, for as long as it is set ([rotating](operations.md#rotating-the-signing-secret))"},
	{Env: "HTTP_ALLOW_HOSTS", Flag: "http-allow-hosts", Help: "comma-separated hosts `http_callback` may reach by name: exact names, IPs (`10.0.0.5`, `[::1]`), or `*.example.com`; empty: any name. `HTTP_ALLOW_NETWORKS` applies too"},
	{Env: "HTTP_ALLOW_NETWORKS", Flag: "http-allow-networks", Default: httpcallback.NetworksPublic, Help: "comma-separated networks `http_callback` may dial, checked on the address of every connection after DNS: CIDRs, IPs, and `public`, `private` or `loopback` ([http_callback](#http_callback))"},
	{Env: "HTTP_MAX_CONNECTIONS_PER_HOST", Flag: "http-max-connections-per-host", Default: strconv.Itoa(httpcallback.DefaultMaxConnsPerHost), Help: "requests, and so connections, a worker has open to one host (name and port) at once; `http_callback` jobs beyond it wait for one within their own timeout"},
	{Env: "HTTP_BREAKER", Flag: "http-breaker", Default: "true", Help: "`false` turns off the circuit breaker per endpoint of `http_callback` jobs ([endpoints](operations.md#endpoints-and-the-circuit-breaker))"},
	{Env: "HTTP_BREAKER_WINDOW", Flag: "http-breaker-window", Default: settings.DurationText(endpoints.DefaultWindow), Help: "the span over which an endpoint's outcomes are counted"},
	{Env: "HTTP_BREAKER_MIN_ATTEMPTS", Flag: "http-breaker-min-attempts", Default: strconv.Itoa(endpoints.DefaultMinAttempts), Help: "the fewest attempts in a window that can open an endpoint's circuit"},
	{Env: "HTTP_BREAKER_FAILURE_PERCENT", Flag: "http-breaker-failure-percent", Default: strconv.Itoa(int(endpoints.DefaultFailureRatio * 100)), Help: "the percentage (1 to 100) of an endpoint's attempts in a window that, failed (429, 5xx, no connection, timeout), open its circuit"},
	{Env: "HTTP_BREAKER_COOL_DOWN", Flag: "http-breaker-cool-down", Default: settings.DurationText(endpoints.DefaultCoolDown), Help: "how long an endpoint stays open before one probe goes; doubled at each failed probe"},
	{Env: "HTTP_BREAKER_MAX_COOL_DOWN", Flag: "http-breaker-max-cool-down", Default: settings.DurationText(endpoints.DefaultMaxCoolDown), Help: "the longest cool-down, and how long a closed endpoint's is kept: one that opens again within it opens for twice its last"},
	{Env: "HTTP_BREAKER_DISABLE_AFTER", Flag: "http-breaker-disable-after", Default: settings.DurationText(endpoints.DefaultDisableAfter), Help: "how long an endpoint may stay open: its first failed probe after it disables the endpoint, whose jobs then fail, dead, until `pgdispatch endpoints enable`; `0`: never"},
	{Env: "HTTP_BREAKER_EVENT_KIND", Flag: "http-breaker-event-kind", Help: "a job kind: each event of an endpoint (opened, closed, disabled, enabled) inserts a job of it that tells of the event, in the same transaction ([events](#endpoint-events)); empty: none. `endpoints disable` and `enable`, and the console's, read it too"},
	{Env: "HTTP_BREAKER_EVENT_QUEUE", Flag: "http-breaker-event-queue", Default: "default", Help: "the queue of the events' jobs"},
	{Env: "HTTP_BREAKER_EVENT_PAYLOAD", Flag: "http-breaker-event-payload", Default: "{}", Help: "the events' jobs' payload, a JSON object, the event set in `data` for `http_callback`, in `body` for `rabbitmq`, else merged in: `{\"url\": \"https://alerts.example/hook\"}`"},
	{Env: "RABBITMQ_URL", Help: "the `rabbitmq` executor's broker, `amqp://user:password@host:5672/vhost`"},
	{Env: "SMTP_HOST", Flag: "smtp-host", Help: "the `email` executor's SMTP server"},
	{Env: "SMTP_PORT", Flag: "smtp-port", Help: "the SMTP server's port; empty: 25, 587 or 465 by `SMTP_TLS`"},
	{Env: "SMTP_USERNAME", Flag: "smtp-username", Help: "user for AUTH PLAIN; empty: no AUTH"},
	{Env: "SMTP_PASSWORD", Help: "password for AUTH PLAIN"},
	{Env: "SMTP_TLS", Flag: "smtp-tls", Default: "starttls", Help: "`none`, `starttls` (required) or `tls` (implicit, SMTPS); `none` with `SMTP_USERNAME` needs `SMTP_ALLOW_PLAINTEXT_AUTH`"},
	{Env: "SMTP_FROM", Flag: "smtp-from", Help: "sender of `email` jobs whose payload has no `from`; a payload may always name its address"},
	{Env: "SMTP_ALLOW_FROM", Flag: "smtp-allow-from", Help: "comma-separated other senders a payload's `from` may name: addresses, or domains for any address at them; `*` allows any. Empty: `SMTP_FROM`'s address only"},
	{Env: "SMTP_MAX_RECIPIENTS", Flag: "smtp-max-recipients", Default: strconv.Itoa(email.DefaultMaxRecipients), Help: "most recipients of one `email` job, in `to`, `cc` and `bcc` together"},
	{Env: "SMTP_ALLOW_PLAINTEXT_AUTH", Flag: "smtp-allow-plaintext-auth", Default: "false", Help: "`true` lets `SMTP_TLS=none` send the username and password unencrypted; without it `run` refuses that setting"},
	{Env: "SMTP_MAX_CONNECTIONS", Flag: "smtp-max-connections", Default: strconv.Itoa(email.DefaultMaxConnections), Help: "SMTP sessions a worker opens at once; `email` jobs beyond it wait for one within their own timeout"},
}

// buildBreaker is the circuit breaker of schema's endpoints that the
// settings configure, or nil when HTTP_BREAKER is false.
func buildBreaker(v *settings.Values, db endpoints.DB, schema string, timeout time.Duration, logger *zap.Logger) (*endpoints.Breaker, error) {
	on, err := strconv.ParseBool(v.Str("HTTP_BREAKER"))
	if err != nil {
		return nil, fmt.Errorf("invalid HTTP_BREAKER %q: want true or false", v.Str("HTTP_BREAKER"))
	}
	if !on {
		return nil, nil
	}
	var errs []error
	percent := v.PositiveInt("HTTP_BREAKER_FAILURE_PERCENT", &errs)
	errs = append(errs, refuse(percent > 100, "invalid HTTP_BREAKER_FAILURE_PERCENT %d: at most 100", percent))
	cfg := endpoints.Config{
		DB: db, Schema: schema, StatementTimeout: timeout, Logger: logger,
		Window: v.PositiveDuration("HTTP_BREAKER_WINDOW", &errs), MinAttempts: v.PositiveInt("HTTP_BREAKER_MIN_ATTEMPTS", &errs),
		FailureRatio: float64(percent) / 100,
		CoolDown:     v.PositiveDuration("HTTP_BREAKER_COOL_DOWN", &errs), MaxCoolDown: v.PositiveDuration("HTTP_BREAKER_MAX_COOL_DOWN", &errs),
	}
	errs = append(errs, refuse(cfg.MaxCoolDown < cfg.CoolDown, "HTTP_BREAKER_MAX_COOL_DOWN (%s) must not be less than HTTP_BREAKER_COOL_DOWN (%s)", cfg.MaxCoolDown, cfg.CoolDown))
	if cfg.DisableAfter = v.Duration("HTTP_BREAKER_DISABLE_AFTER", &errs); cfg.DisableAfter == 0 {
		cfg.DisableAfter = -1 // never
	}
	job, err := eventJob(v)
	errs = append(errs, err)
	cfg.EventKind, cfg.EventQueue, cfg.EventPayload = job.Kind, job.Queue, job.Payload
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return endpoints.New(cfg)
}

// eventSettings are the settings of the events' jobs, which the operator's
// endpoints disable and enable read too.
var eventSettings = settings.Only(executorSettings, "HTTP_BREAKER_EVENT_KIND", "HTTP_BREAKER_EVENT_QUEUE", "HTTP_BREAKER_EVENT_PAYLOAD")

// eventJob is the job that the settings ask each endpoint event to insert.
func eventJob(v *settings.Values) (admin.EventJob, error) {
	job := admin.EventJob{Kind: v.Str("HTTP_BREAKER_EVENT_KIND"), Queue: v.Str("HTTP_BREAKER_EVENT_QUEUE")}
	if p := v.Str("HTTP_BREAKER_EVENT_PAYLOAD"); p != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(p), &m); err != nil || m == nil {
			return job, errors.New("invalid HTTP_BREAKER_EVENT_PAYLOAD: want a JSON object")
		}
		job.Payload = json.RawMessage(p)
	}
	if len(job.Kind) > 128 || len(job.Queue) > 128 {
		return job, errors.New("invalid HTTP_BREAKER_EVENT_KIND or HTTP_BREAKER_EVENT_QUEUE: at most 128 characters")
	}
	if err := checkEventPayload(job); err != nil {
		return job, fmt.Errorf("invalid HTTP_BREAKER_EVENT_PAYLOAD for %s jobs: %w", job.Kind, err)
	}
	return job, nil
}

// checkEventPayload refuses the payload of an event's job of a built-in
// kind that its executor would refuse, as endpoint_event (migration 020)
// makes it: the event set in data (http_callback) or body (rabbitmq). A
// payload without a url would make every event's job dead at the first
// outage, which the events are there to tell of.
func checkEventPayload(job admin.EventJob) error {
	validate, field := map[string]func(json.RawMessage) error{
		httpcallback.Kind: httpcallback.Validate, rabbitmq.Kind: rabbitmq.Validate,
	}[job.Kind], map[string]string{httpcallback.Kind: "data", rabbitmq.Kind: "body"}[job.Kind]
	if validate == nil {
		return nil
	}
	p := map[string]json.RawMessage{}
	if len(job.Payload) > 0 {
		if err := json.Unmarshal(job.Payload, &p); err != nil {
			return err
		}
	}
	p[field] = json.RawMessage(`{"event": "opened", "endpoint": "https://hooks.example.com:443"}`)
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return validate(raw)
}

// buildRegistry registers the built-in executors that the settings
// configure; http_callback signs with keyring's secrets too, and keeps
// breaker's circuits (nil: none). A kind whose settings are missing is still registered, and
// fails its jobs with a message that says what to set. close releases the
// executors' connections.
func buildRegistry(v *settings.Values, logger *zap.Logger, workerID string, keyring *signing.Keyring, breaker *endpoints.Breaker) (reg *executors.Registry, close func(), err error) {
	reg = executors.NewRegistry()
	var errs []error

	httpExec, err := httpcallback.New(httpcallback.Config{
		SigningSecret: v.Str("HTTP_SIGNING_SECRET"), Keyring: keyring, AllowHosts: list(v.Str("HTTP_ALLOW_HOSTS")),
		AllowNetworks:   list(v.Str("HTTP_ALLOW_NETWORKS")),
		MaxConnsPerHost: max(v.PositiveInt("HTTP_MAX_CONNECTIONS_PER_HOST", &errs), 0), // a bad value is reported once
		Breaker:         breaker,
		Logger:          logger,
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("HTTP settings: %w", err))
	} else {
		reg.Register(httpcallback.Kind, httpExec)
	}

	close = func() {}
	if u := v.Str("RABBITMQ_URL"); u != "" {
		rabbit, err := rabbitmq.New(rabbitmq.Config{URL: u, Name: "pgdispatch " + workerID, Logger: logger})
		if err != nil {
			errs = append(errs, fmt.Errorf("invalid RABBITMQ_URL: %w", err))
		} else {
			reg.Register(rabbitmq.Kind, rabbit)
			close = func() { _ = rabbit.Close() }
		}
	} else {
		reg.Register(rabbitmq.Kind, executors.NotConfigured{Kind: rabbitmq.Kind, Setting: "RABBITMQ_URL"})
	}

	if host := v.Str("SMTP_HOST"); host != "" {
		port, err := strconv.Atoi(cmp.Or(v.Str("SMTP_PORT"), "0"))
		errs = append(errs, refuse(err != nil, "invalid SMTP_PORT %q: want a port number", v.Str("SMTP_PORT")))
		plaintext, err := strconv.ParseBool(v.Str("SMTP_ALLOW_PLAINTEXT_AUTH"))
		errs = append(errs, refuse(err != nil, "invalid SMTP_ALLOW_PLAINTEXT_AUTH %q: want true or false", v.Str("SMTP_ALLOW_PLAINTEXT_AUTH")))
		mailer, err := email.New(email.Config{
			Host: host, Port: port, Username: v.Str("SMTP_USERNAME"), Password: v.Str("SMTP_PASSWORD"),
			TLS: v.Str("SMTP_TLS"), From: v.Str("SMTP_FROM"), MaxConnections: v.PositiveInt("SMTP_MAX_CONNECTIONS", &errs),
			AllowFrom: list(v.Str("SMTP_ALLOW_FROM")), MaxRecipients: max(v.PositiveInt("SMTP_MAX_RECIPIENTS", &errs), 0),
			AllowPlaintextAuth: plaintext,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("SMTP settings: %w", err))
		} else {
			reg.Register(email.Kind, mailer)
		}
	} else {
		reg.Register(email.Kind, executors.NotConfigured{Kind: email.Kind, Setting: "SMTP_HOST"})
	}
	if err := errors.Join(errs...); err != nil {
		close()
		return nil, nil, err
	}
	return reg, close, nil
}

// list splits a comma-separated setting, without empty items.
func list(s string) []string {
	var items []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

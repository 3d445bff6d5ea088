package main

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
)

// The executors' settings, for run.
var executorSettings = []setting{
	{env: "HTTP_SIGNING_SECRET", help: "sign `http_callback` requests per Standard Webhooks with this base64 secret (`whsec_` prefix optional; make one with `echo \"whsec_$(openssl rand -base64 32)\"`)"},
	{env: "HTTP_ALLOW_HOSTS", flag: "http-allow-hosts", help: "comma-separated hosts `http_callback` may reach by name: exact names, IPs (`10.0.0.5`, `[::1]`), or `*.example.com`; empty: any name. `HTTP_ALLOW_NETWORKS` applies too"},
	{env: "HTTP_ALLOW_NETWORKS", flag: "http-allow-networks", def: httpcallback.NetworksPublic, help: "comma-separated networks `http_callback` may dial, checked on the address of every connection after DNS: CIDRs, IPs, and `public`, `private` or `loopback` ([http_callback](#http_callback))"},
	{env: "HTTP_MAX_CONNECTIONS_PER_HOST", flag: "http-max-connections-per-host", def: strconv.Itoa(httpcallback.DefaultMaxConnsPerHost), help: "requests, and so connections, a worker has open to one host (name and port) at once; `http_callback` jobs beyond it wait for one within their own timeout"},
	{env: "RABBITMQ_URL", help: "the `rabbitmq` executor's broker, `amqp://user:password@host:5672/vhost`"},
	{env: "SMTP_HOST", flag: "smtp-host", help: "the `email` executor's SMTP server"},
	{env: "SMTP_PORT", flag: "smtp-port", help: "the SMTP server's port; empty: 25, 587 or 465 by `SMTP_TLS`"},
	{env: "SMTP_USERNAME", flag: "smtp-username", help: "user for AUTH PLAIN; empty: no AUTH"},
	{env: "SMTP_PASSWORD", help: "password for AUTH PLAIN"},
	{env: "SMTP_TLS", flag: "smtp-tls", def: "starttls", help: "`none`, `starttls` (required) or `tls` (implicit, SMTPS); `none` with `SMTP_USERNAME` needs `SMTP_ALLOW_PLAINTEXT_AUTH`"},
	{env: "SMTP_FROM", flag: "smtp-from", help: "sender of `email` jobs whose payload has no `from`; a payload may always name its address"},
	{env: "SMTP_ALLOW_FROM", flag: "smtp-allow-from", help: "comma-separated other senders a payload's `from` may name: addresses, or domains for any address at them; `*` allows any. Empty: `SMTP_FROM`'s address only"},
	{env: "SMTP_MAX_RECIPIENTS", flag: "smtp-max-recipients", def: strconv.Itoa(email.DefaultMaxRecipients), help: "most recipients of one `email` job, in `to`, `cc` and `bcc` together"},
	{env: "SMTP_ALLOW_PLAINTEXT_AUTH", flag: "smtp-allow-plaintext-auth", def: "false", help: "`true` lets `SMTP_TLS=none` send the username and password unencrypted; without it `run` refuses that setting"},
	{env: "SMTP_MAX_CONNECTIONS", flag: "smtp-max-connections", def: strconv.Itoa(email.DefaultMaxConnections), help: "SMTP sessions a worker opens at once; `email` jobs beyond it wait for one within their own timeout"},
}

// buildRegistry registers the built-in executors that the settings
// configure. A kind whose settings are missing is still registered, and
// fails its jobs with a message that says what to set. close releases the
// executors' connections.
func buildRegistry(v *values, logger *zap.Logger, workerID string) (reg *executors.Registry, close func(), err error) {
	reg = executors.NewRegistry()
	var errs []error

	httpExec, err := httpcallback.New(httpcallback.Config{
		SigningSecret: v.str("HTTP_SIGNING_SECRET"), AllowHosts: list(v.str("HTTP_ALLOW_HOSTS")),
		AllowNetworks:   list(v.str("HTTP_ALLOW_NETWORKS")),
		MaxConnsPerHost: max(v.positiveInt("HTTP_MAX_CONNECTIONS_PER_HOST", &errs), 0), // a bad value is reported once
		Logger:          logger,
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("HTTP settings: %w", err))
	} else {
		reg.Register(httpcallback.Kind, httpExec)
	}

	close = func() {}
	if u := v.str("RABBITMQ_URL"); u != "" {
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

	if host := v.str("SMTP_HOST"); host != "" {
		port, err := strconv.Atoi(cmp.Or(v.str("SMTP_PORT"), "0"))
		errs = append(errs, refuse(err != nil, "invalid SMTP_PORT %q: want a port number", v.str("SMTP_PORT")))
		plaintext, err := strconv.ParseBool(v.str("SMTP_ALLOW_PLAINTEXT_AUTH"))
		errs = append(errs, refuse(err != nil, "invalid SMTP_ALLOW_PLAINTEXT_AUTH %q: want true or false", v.str("SMTP_ALLOW_PLAINTEXT_AUTH")))
		mailer, err := email.New(email.Config{
			Host: host, Port: port, Username: v.str("SMTP_USERNAME"), Password: v.str("SMTP_PASSWORD"),
			TLS: v.str("SMTP_TLS"), From: v.str("SMTP_FROM"), MaxConnections: v.positiveInt("SMTP_MAX_CONNECTIONS", &errs),
			AllowFrom: list(v.str("SMTP_ALLOW_FROM")), MaxRecipients: max(v.positiveInt("SMTP_MAX_RECIPIENTS", &errs), 0),
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

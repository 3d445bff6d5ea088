package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/console"
)

// The settings of console alone. The tokens have no flag: they are
// secrets, which a process listing would show.
var consoleSettings = []settings.Setting{
	{Env: "CONSOLE_LISTEN", Flag: "listen", Default: console.DefaultListen, Help: "address the web console serves on; keep it on loopback, or behind TLS"},
	{Env: "CONSOLE_OPERATOR_TOKEN", Help: "password of the console's operators, who may act (retry, cancel, snooze, delete, pause, resume, disable and enable endpoints) and reveal secrets; the user name is who the actions are logged as"},
	{Env: "CONSOLE_VIEWER_TOKEN", Help: "password of the console's viewers, who may only read"},
}

func consoleCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("console", "Serve the web console: queues, workers, jobs and their attempts, schedules and dispatch triggers, live.\n"+
		"Sign in with your name and CONSOLE_OPERATOR_TOKEN (or CONSOLE_VIEWER_TOKEN to only read).", stderr)
	v := settings.New(fs, connSettings, consoleSettings, eventSettings)
	if err := parse(fs, args); err != nil {
		return err
	}
	events, err := eventJob(v)
	if err != nil {
		return err
	}
	addr := v.Str("CONSOLE_LISTEN")
	operatorToken, viewerToken := v.Str("CONSOLE_OPERATOR_TOKEN"), v.Str("CONSOLE_VIEWER_TOKEN")
	if operatorToken == "" && viewerToken == "" {
		return errors.New("the console needs credentials: set CONSOLE_OPERATOR_TOKEN (and CONSOLE_VIEWER_TOKEN for read-only users)")
	}
	c, err := openConn(ctx, v, databaseURL(v))
	if err != nil {
		return err
	}
	defer c.pool.Close()
	if err := c.checkSchema(ctx); err != nil {
		return err
	}
	listenConfig, err := pgdispatch.ListenConnConfigFor(c.pool, c.listenURL)
	if err != nil {
		return fmt.Errorf("invalid LISTEN_DATABASE_URL: %w", err)
	}
	listenConfig.RuntimeParams["application_name"] = "pgdispatch-console"
	srv, err := console.New(console.Config{
		Pool: c.pool, Schema: c.schema, ListenConfig: listenConfig, Timeout: c.timeout,
		OperatorToken: operatorToken, ViewerToken: viewerToken, Logger: c.logger, EndpointEventJob: events,
	})
	if err != nil {
		return err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	if !console.Loopback(addr) {
		c.logger.Warn("the console listens off loopback: put it behind TLS", zap.String("addr", ln.Addr().String()))
	}
	fmt.Fprintf(stdout, "pgdispatch console: http://%s/\n", ln.Addr())
	return srv.Serve(ctx, ln)
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
	"github.com/pgdispatch/pgdispatch/triggers"
)

const triggersUsage = `Usage:
  pgdispatch triggers add --table TABLE --kind KIND [flags]   attach a dispatch trigger to a table
  pgdispatch triggers list [--json]                           list the dispatch triggers
  pgdispatch triggers remove NAME                             drop a dispatch trigger

A dispatch trigger makes each inserted, updated or deleted row of the table a
job, in the writer's own transaction. Run 'pgdispatch triggers add --help' for
the flags.
`

func triggersCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "triggers", triggersUsage, map[string]commandFunc{
		"add": triggersAdd, "list": triggersList, "remove": triggersRemove,
	}, args, stdout, stderr)
}

func triggersAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("triggers add", "Attach a dispatch trigger to a table: each changed row becomes a job whose payload is\n"+
		"--payload with the event (operation, schema, table, new and old row, event id) merged in:\n"+
		"under \"data\" for http_callback, \"body\" for rabbitmq, \"event\" for other kinds.", stderr)
	v := settings.New(fs, connSettings)
	var s triggers.Spec
	fs.StringVar(&s.Table, "table", "", `the table, as SQL reads it: public.orders, or 'public."Odd name"' (required)`)
	on := fs.String("on", "insert", "comma-separated events: insert, update, delete")
	fs.StringVar(&s.Kind, "kind", "", "the jobs' kind (required)")
	payload := fs.String("payload", "{}", "the jobs' payload, a JSON object, such as {\"url\": \"https://example.test/orders\"}")
	fs.StringVar(&s.Queue, "queue", pgdispatch.DefaultQueue, "the jobs' queue")
	fs.StringVar(&s.When, "when", "", "a WHEN condition over NEW and OLD, such as \"NEW.status = 'paid'\"; no ';' or comments")
	fs.StringVar(&s.FlowKey, "flow-key", "", "a column of the table whose value is the jobs' flow key (the old row's for delete); default: no key")
	fs.StringVar(&s.Name, "name", "", "the trigger's name (default: <table>_<kind>)")
	fs.DurationVar(&s.LockWait, "lock-wait", triggers.DefaultLockWait, "how long to wait for the table's lock; writers queue behind the wait, so keep it short")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := errors.Join(
		refuse(s.Table == "", "--table is required"),
		refuse(s.Kind == "", "--kind is required"),
		refuse(!json.Valid([]byte(*payload)), "--payload is not valid JSON: %q", *payload),
	); err != nil {
		return err
	}
	s.Payload = json.RawMessage(*payload)
	for _, e := range strings.Split(*on, ",") {
		s.Events = append(s.Events, strings.TrimSpace(e))
	}
	var (
		name    string
		created bool
	)
	err := onDatabase(ctx, v, s.LockWait, func(ctx context.Context, c *conn) (err error) {
		name, created, err = triggers.Add(ctx, c.pool, c.schema, s)
		return err
	})
	if err != nil {
		return err
	}
	if !created {
		fmt.Fprintf(stdout, "trigger %s exists already: nothing changed (remove it first to change it)\n", name)
		return nil
	}
	fmt.Fprintf(stdout, "trigger %s added on %s\n", name, s.Table)
	return nil
}

func triggersList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("triggers list", "List the dispatch triggers.", stderr)
	v := settings.New(fs, connSettings)
	asJSON := fs.Bool("json", false, "print JSON")
	reveal := fs.Bool("reveal", false, "show the payloads' secrets as they are: URL user info and query values, and the values of keys such as Authorization or X-Api-Key")
	if err := parse(fs, args); err != nil {
		return err
	}
	var list []triggers.Trigger
	err := onDatabase(ctx, v, 0, func(ctx context.Context, c *conn) (err error) {
		list, err = triggers.List(ctx, c.pool, c.schema)
		return err
	})
	if err != nil {
		return err
	}
	if !*reveal {
		for i := range list {
			list[i].Payload = admin.MaskJSON(list[i].Payload)
		}
	}
	if *asJSON {
		return printJSON(stdout, list)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTABLE\tON\tKIND\tQUEUE\tWHEN\tFLOW KEY\tPAYLOAD")
	for _, t := range list {
		name := t.Name
		switch {
		case !t.Present:
			name += " (dropped by hand)"
		case !t.Matches:
			name += " (NOT AS RECORDED: remove it)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", termsafe.String(name), termsafe.String(t.Table), strings.Join(t.Events, ","),
			termsafe.String(t.Kind), termsafe.String(t.Queue), termsafe.String(t.When), termsafe.String(t.FlowKey), termsafe.String(string(t.Payload)))
	}
	return tw.Flush()
}

func triggersRemove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("triggers remove", "Drop a dispatch trigger: pgdispatch triggers remove [flags] NAME", stderr)
	v := settings.New(fs, connSettings)
	wait := fs.Duration("lock-wait", triggers.DefaultLockWait, "how long to wait for the table's lock")
	names, err := parseNames(fs, args)
	if err != nil {
		return err
	}
	if len(names) != 1 {
		return usageError(fs, "want exactly one trigger name")
	}
	err = onDatabase(ctx, v, *wait, func(ctx context.Context, c *conn) error {
		return triggers.Remove(ctx, c.pool, c.schema, names[0], *wait)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "trigger %s removed\n", names[0])
	return nil
}

// onDatabase connects as v says and runs f with a context bounded by the
// statement timeout plus extra (a lock wait), then closes the connection.
func onDatabase(ctx context.Context, v *settings.Values, extra time.Duration, f func(ctx context.Context, c *conn) error) error {
	return withConn(ctx, v, func(c *conn) error {
		callCtx, cancel := context.WithTimeout(ctx, c.timeout+extra)
		defer cancel()
		return f(callCtx, c)
	})
}

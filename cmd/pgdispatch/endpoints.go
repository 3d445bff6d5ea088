package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
	"github.com/pgdispatch/pgdispatch/executors"
)

const endpointsUsage = `Usage:
  pgdispatch endpoints list [--json]

list shows the receivers of http_callback jobs (scheme, host and port) and
their circuit breakers: closed (requests go), open (their jobs wait,
pending, until OPEN UNTIL) or half_open (one probe is in flight), the
attempts and failures of the current window, and the last failure before
the circuit opened. See docs/operations.md, "Endpoints and the circuit
breaker".
Run 'pgdispatch endpoints COMMAND --help' for the flags.
`

func endpointsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "endpoints", endpointsUsage, map[string]commandFunc{"list": endpointsList}, args, stdout, stderr)
}

// maxReasonShown bounds the reason in the table; --json has all of it.
const maxReasonShown = 80

func endpointsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("endpoints list", "List the endpoints of http_callback jobs and their circuit breakers.", stderr)
	v := settings.New(fs, connSettings)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		list, err := a.Endpoints(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			if list == nil {
				list = []admin.Endpoint{}
			}
			return printJSON(stdout, list)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ENDPOINT\tSTATE\tATTEMPTS\tFAILURES\tOPENED\tOPEN UNTIL\tREASON")
		for _, e := range list {
			opened, until, reason := "-", "-", "-"
			if e.OpenedAt != nil {
				opened = e.OpenedAt.Local().Format(time.RFC3339)
			}
			switch {
			case e.State == "open" && e.OpenUntil != nil:
				until = e.OpenUntil.Local().Format(time.RFC3339)
			case e.State == "half_open" && e.ProbeUntil != nil:
				until = "probe until " + e.ProbeUntil.Local().Format(time.RFC3339)
			}
			if e.Reason != "" {
				if reason = executors.Excerpt(e.Reason, maxReasonShown); reason != e.Reason {
					reason += "…"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", termsafe.String(e.Endpoint), e.State, e.Attempts, e.Failures,
				opened, until, termsafe.String(reason))
		}
		return tw.Flush()
	})
}

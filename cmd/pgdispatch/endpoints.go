package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors"
)

const endpointsUsage = `Usage:
  pgdispatch endpoints list [--json]
  pgdispatch endpoints events [ENDPOINT] [--limit N] [--json]
  pgdispatch endpoints disable ENDPOINT [--note TEXT]
  pgdispatch endpoints enable ENDPOINT
  pgdispatch endpoints note ENDPOINT TEXT

list shows the receivers of http_callback jobs (scheme, host and port) and
their circuit breakers: closed (requests go), open (their jobs wait,
pending, until OPEN UNTIL) or half_open (one probe is in flight), the
attempts and failures of the current window, the last failure before
the circuit opened, when it was disabled and the operator's note.
events shows the newest events: opened, closed, disabled, enabled.
disable makes an endpoint's jobs fail, dead, without a request, until
enable closes its circuit; its dead jobs come back with
'pgdispatch jobs retry --all-dead --host HOST:PORT --yes'. note sets the
operator's note ("" clears it). ENDPOINT is as list shows it, or any URL
of it. See docs/operations.md, "Endpoints and the circuit breaker".
Run 'pgdispatch endpoints COMMAND --help' for the flags.
`

func endpointsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "endpoints", endpointsUsage, map[string]commandFunc{
		"list": endpointsList, "events": endpointsEvents, "disable": endpointsDisable, "enable": endpointsEnable,
		"note": endpointsNote,
	}, args, stdout, stderr)
}

// endpointArg is the endpoint an argument names: an endpoint as list
// shows it, or a URL, of which it takes the scheme, host and port. The
// argument is not echoed: a URL may hold a secret.
func endpointArg(fs *flag.FlagSet, arg string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(arg))
	if err != nil || u.Scheme == "" || u.Hostname() == "" {
		return "", usageError(fs, "give an endpoint as endpoints list shows it (https://hooks.example.com:443), or a URL")
	}
	return endpoints.Of(u), nil
}

// endpointAndJob reads the one endpoint args name (endpointArg) and the
// event's job the settings give (eventJob).
func endpointAndJob(fs *flag.FlagSet, v *settings.Values, args []string) (string, admin.EventJob, error) {
	name, err := oneName(fs, args, "endpoint")
	if err != nil {
		return "", admin.EventJob{}, err
	}
	endpoint, err := endpointArg(fs, name)
	if err != nil {
		return "", admin.EventJob{}, err
	}
	job, err := eventJob(v)
	return endpoint, job, err
}

func endpointsDisable(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("endpoints disable", "Disable an endpoint: its http_callback jobs fail, dead, unsent, until it is enabled: "+
		"pgdispatch endpoints disable ENDPOINT [--note TEXT]", stderr)
	v := settings.New(fs, connSettings, eventSettings)
	note := fs.String("note", "", "the operator's note, shown by endpoints list; empty: the note stays")
	endpoint, job, err := endpointAndJob(fs, v, args)
	if err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		changed, err := a.DisableEndpoint(ctx, endpoint, *note, job)
		if err != nil {
			return err
		}
		if !changed {
			fmt.Fprintf(stdout, "endpoint %s: already disabled\n", termsafe.String(endpoint))
			return errNothingChanged
		}
		fmt.Fprintf(stdout, "endpoint %s: disabled; its jobs fail until 'pgdispatch endpoints enable %s'\n",
			termsafe.String(endpoint), termsafe.String(endpoints.ShellArg(endpoint)))
		return nil
	})
}

func endpointsEnable(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("endpoints enable", "Enable a disabled endpoint and close its circuit: its jobs go: "+
		"pgdispatch endpoints enable ENDPOINT", stderr)
	v := settings.New(fs, connSettings, eventSettings)
	endpoint, job, err := endpointAndJob(fs, v, args)
	if err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		changed, err := a.EnableEndpoint(ctx, endpoint, job)
		if err != nil {
			return err
		}
		if !changed {
			fmt.Fprintf(stdout, "endpoint %s: not disabled\n", termsafe.String(endpoint))
			return errNothingChanged
		}
		fmt.Fprintf(stdout, "endpoint %s: enabled; the jobs that died while it was disabled: "+
			"'%s' counts them, --yes retries them\n",
			termsafe.String(endpoint), termsafe.String(endpoints.RetryCommand(endpoint)))
		return nil
	})
}

func endpointsNote(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("endpoints note", "Set an endpoint's note, shown by endpoints list; \"\" clears it: "+
		"pgdispatch endpoints note ENDPOINT TEXT", stderr)
	v := settings.New(fs, connSettings)
	names, err := parseNames(fs, args)
	if err != nil {
		return err
	}
	if len(names) != 2 {
		return usageError(fs, "give an endpoint and a note")
	}
	endpoint, err := endpointArg(fs, names[0])
	if err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		if err := a.SetEndpointNote(ctx, endpoint, names[1]); err != nil {
			return err
		}
		said := "note set"
		if names[1] == "" {
			said = "note cleared"
		}
		fmt.Fprintf(stdout, "endpoint %s: %s\n", termsafe.String(endpoint), said)
		return nil
	})
}

func endpointsEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("endpoints events", "List the newest events of the endpoints' circuits, or of one: "+
		"pgdispatch endpoints events [ENDPOINT] [flags]", stderr)
	v := settings.New(fs, connSettings)
	limit := fs.Int("limit", 50, "the most events shown, the newest")
	asJSON := fs.Bool("json", false, "print JSON")
	names, err := parseNames(fs, args)
	if err != nil {
		return err
	}
	var endpoint string
	switch {
	case len(names) > 1:
		return usageError(fs, "give one endpoint, or none")
	case len(names) == 1:
		if endpoint, err = endpointArg(fs, names[0]); err != nil {
			return err
		}
	}
	if *limit < 1 {
		return usageError(fs, "--limit must be 1 or more")
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		list, err := a.EndpointEvents(ctx, endpoint, *limit)
		if err != nil {
			return err
		}
		if *asJSON {
			if list == nil {
				list = []admin.EndpointEvent{}
			}
			return printJSON(stdout, list)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tAT\tENDPOINT\tEVENT\tBY\tJOB\tREASON / NOTE")
		for _, e := range list {
			job := "-"
			if e.JobID != nil {
				job = strconv.FormatInt(*e.JobID, 10)
			}
			text := strings.Join(slices.DeleteFunc([]string{shortReason(e.Reason), e.Note}, func(s string) bool { return s == "" }), " / ")
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s (%s)\t%s\t%s\n", e.ID, e.At.Local().Format(time.RFC3339),
				termsafe.String(e.Endpoint), e.Event, e.By, termsafe.String(e.Role), job, termsafe.String(cmp.Or(text, "-")))
		}
		return tw.Flush()
	})
}

// shortReason is reason cut to maxReasonShown characters.
func shortReason(reason string) string {
	if r := executors.Excerpt(reason, maxReasonShown); r != reason {
		return r + "…"
	}
	return reason
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
		fmt.Fprintln(tw, "ENDPOINT\tSTATE\tATTEMPTS\tFAILURES\tOPENED\tOPEN UNTIL\tDISABLED\tREASON\tNOTE")
		for _, e := range list {
			opened, until, reason, disabled, note := "-", "-", "-", "-", "-"
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
				reason = shortReason(e.Reason)
			}
			if e.DisabledAt != nil {
				disabled = e.DisabledAt.Local().Format(time.RFC3339) + " by " + e.DisabledBy
				until = "-" // no probe goes
			}
			if e.Note != "" {
				note = shortReason(e.Note)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", termsafe.String(e.Endpoint), e.State, e.Attempts, e.Failures,
				opened, until, disabled, termsafe.String(reason), termsafe.String(note))
		}
		return tw.Flush()
	})
}

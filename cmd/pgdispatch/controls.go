package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
)

// printHistory prints j's failed attempts and its result, for jobs show.
func printHistory(w io.Writer, j admin.Job) error {
	entries, skipped := j.History()
	if len(entries) > 0 || skipped > 0 {
		fmt.Fprintf(w, "errors (failed attempts, oldest first; the last 20 are kept)\n")
	}
	for _, e := range entries {
		took := "-"
		if e.StartedAt != nil && e.FinishedAt != nil {
			took = e.FinishedAt.Sub(*e.StartedAt).Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "  attempt %d  %s  took %s  on %s\n    %s\n", e.Attempt, stampOr(e.FinishedAt), took,
			termsafe.String(e.Worker), termsafe.Lines(strings.ReplaceAll(e.Error, "\n", "\n    ")))
		if len(e.Result) > 0 {
			fmt.Fprintf(w, "    result %s\n", termsafe.String(string(compact(e.Result))))
		}
	}
	if skipped > 0 {
		fmt.Fprintf(w, "  (%d entries not in the worker's form: --json shows them)\n", skipped)
	}
	if len(j.Result) > 0 && string(j.Result) != "null" {
		fmt.Fprintf(w, "result\n  %s\n", termsafe.String(string(compact(j.Result))))
	}
	return nil
}

func compact(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

func jobsSnooze(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs snooze", "Make pending jobs due later, without spending an attempt: pgdispatch jobs snooze --for D ID...", stderr)
	v := settings.New(fs, connSettings)
	d := fs.Duration("for", 0, "how long from now the jobs are due (required; for example 10m)")
	ids, err := parseIDs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 || *d <= 0 {
		return usageError(fs, "give --for with a positive duration, and job ids")
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		changes, err := a.Snooze(ctx, ids, *d)
		return printChanges(stdout, changes, err, "snoozed for "+d.String(), "pending")
	})
}

const queuesUsage = `Usage:
  pgdispatch queues list [--json]
  pgdispatch queues pause [--force] QUEUE
  pgdispatch queues resume QUEUE

pause stops every worker from claiming the queue's jobs, from its next
claim on, and keeps accepting new ones; running jobs finish. The pause is a
row in the queues table, so it holds across restarts. resume wakes the
queue's workers, which claim its due jobs at once. list shows each queue
that holds pending or running jobs, or is paused. pause refuses a queue
that no job, schedule or dispatch trigger names and no worker serves,
most likely a mistyped one, unless --force is given. A pause or resume
that found the queue as asked already exits 1.
Run 'pgdispatch queues COMMAND --help' for the flags.
`

func queuesCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "queues", queuesUsage, map[string]commandFunc{
		"list": queuesList, "pause": queuesPause, "resume": queuesResume,
	}, args, stdout, stderr)
}

func queuesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("queues list", "List the queues: their state and their pending and running jobs.", stderr)
	v := settings.New(fs, connSettings)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		queues, err := a.Queues(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, queues)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "QUEUE\tSTATE\tSINCE\tPENDING\tRUNNING")
		for _, q := range queues {
			state, since := "active", "-"
			if q.PausedAt != nil {
				state, since = "paused", q.PausedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", termsafe.String(q.Name), state, since, q.Pending, q.Running)
		}
		return tw.Flush()
	})
}

func queuesPause(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return toggle(ctx, toggleCommand{
		noun: "queue", verb: "pause", set: (*admin.Admin).Pause, known: (*admin.Admin).QueueKnown,
		help: "Pause a queue: no worker claims its jobs until it is resumed: pgdispatch queues pause [--force] QUEUE\n\n" +
			"A queue that no job, schedule or dispatch trigger names, and no worker serves, is refused unless --force is given.",
	}, args, stdout, stderr)
}

func queuesResume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return toggle(ctx, toggleCommand{
		noun: "queue", verb: "resume", set: (*admin.Admin).Resume,
		help: "Resume a paused queue: its workers claim its due jobs at once: pgdispatch queues resume QUEUE",
	}, args, stdout, stderr)
}

// toggleCommand is the pause or resume (verb) of one queue or schedule
// (noun).
type toggleCommand struct {
	noun, verb, help string
	// set changes the state, and reports whether it changed.
	set func(*admin.Admin, context.Context, string) (bool, error)
	// known, when set, reports whether anything names the name: an unknown
	// one is refused unless --force is given.
	known func(*admin.Admin, context.Context, string) (bool, error)
}

// errNothingChanged ends a pause or resume that found the state as asked
// already: a command that did nothing exits non-zero.
var errNothingChanged = errors.New("nothing changed")

func toggle(ctx context.Context, c toggleCommand, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(c.noun+"s "+c.verb, c.help, stderr)
	v := settings.New(fs, connSettings)
	var force *bool
	if c.known != nil {
		force = fs.Bool("force", false, c.verb+" the "+c.noun+" even when nothing names it")
	}
	name, err := oneName(fs, args, c.noun)
	if err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		if c.known != nil && !*force {
			known, err := c.known(a, ctx, name)
			if err != nil {
				return err
			}
			if !known {
				return fmt.Errorf("%s %q is unknown: no job, schedule or dispatch trigger names it and no worker serves it; "+
					"check its spelling, or give --force to %s it anyway", c.noun, name, c.verb)
			}
		}
		changed, err := c.set(a, ctx, name)
		if err != nil {
			return err
		}
		said := map[[2]bool]string{
			{true, true}: "paused", {true, false}: "already paused",
			{false, true}: "resumed", {false, false}: "not paused",
		}[[2]bool{c.verb == "pause", changed}]
		fmt.Fprintf(stdout, "%s %s: %s\n", c.noun, termsafe.String(name), said)
		if !changed {
			return errNothingChanged
		}
		return nil
	})
}

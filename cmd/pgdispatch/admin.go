package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
)

// statsCommand prints the numbers per queue and kind.
func statsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("stats", "Per queue and kind: jobs by status, the age of the oldest due pending job, and the jobs\n"+
		"that finished in the last minute (done jobs count only while RETAIN_DONE keeps them);\n"+
		"then each schedule's next and last run and its missed and caught-up slots (not in --json:\n"+
		"schedules list --json has them).\n"+
		"Counting the kept done, dead and cancelled jobs reads every such row; when it needs\n"+
		"longer than --finished-budget, those columns are left out.", stderr)
	v := settings.New(fs, connSettings)
	asJSON := fs.Bool("json", false, "print JSON (done, dead and cancelled are null when left out)")
	budget := fs.Duration("finished-budget", admin.DefaultFinishedBudget,
		"the longest the count of kept done, dead and cancelled jobs may take (at most STATEMENT_TIMEOUT)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *budget <= 0 {
		return usageError(fs, "--finished-budget must be positive, not %s", *budget)
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		stats, counted, err := a.Stats(ctx, *budget)
		if err != nil {
			return err
		}
		if !counted {
			fmt.Fprintf(stderr, "the kept done, dead and cancelled jobs took longer than %s to count: those columns are left out (--finished-budget)\n", *budget)
		}
		if *asJSON {
			return printJSON(stdout, stats)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "QUEUE\tKIND\tPENDING\tDUE\tRUNNING\tDONE\tDEAD\tCANCELLED\tOLDEST DUE\tDONE/MIN\tDEAD/MIN\t")
		for _, s := range stats {
			oldest := "-"
			if s.OldestDueSeconds != nil {
				oldest = time.Duration(*s.OldestDueSeconds * float64(time.Second)).Round(time.Millisecond).String()
			}
			queue := termsafe.String(s.Queue)
			if s.Paused {
				queue += " (paused)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t\n", queue, termsafe.String(s.Kind), s.Pending, s.Due, s.Running,
				count(s.Done), count(s.Dead), count(s.Cancelled), oldest, s.DoneLastMinute, s.DeadLastMinute)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		schedules, err := a.Schedules(ctx)
		if err != nil || len(schedules) == 0 {
			return err
		}
		fmt.Fprintln(stdout)
		return printSchedules(stdout, schedules, false)
	})
}

// count prints a count that may be left out.
func count(n *int64) string {
	if n == nil {
		return "?"
	}
	return strconv.FormatInt(*n, 10)
}

const jobsUsage = `Usage:
  pgdispatch jobs list [--status S,...] [--queue Q] [--kind K] [--limit N] [--json] [--reveal]
  pgdispatch jobs show [--json] [--reveal] ID
  pgdispatch jobs retry ID... | --all-dead [--queue Q] [--kind K] [--since T] [--until T] [--host H] [--yes]
  pgdispatch jobs cancel ID...
  pgdispatch jobs snooze --for D ID...

show prints the job's failed attempts (its errors, the last 20) and the
result of the attempt that succeeded. retry makes dead or cancelled jobs
pending and due now, with one more attempt if theirs are used up; retry
--all-dead selects dead jobs by queue, kind, the time they died (--since
inclusive, --until exclusive: an RFC 3339 time or a duration ago, such as
2h) and an http_callback receiver's --host, and only counts them, changing
nothing, unless --yes is given. cancel makes pending or running jobs
cancelled; the worker running one cancels its executor's context within
milliseconds and drops its outcome. snooze makes pending jobs due later
without spending an attempt. All work in batches with rows locked in id
order, so they are safe while workers run. retry, cancel and snooze exit 1
when they changed no job, or an id matched none. Run 'pgdispatch jobs COMMAND
--help' for the flags.

Rows are written by anyone who may insert a job, so list and show escape
control characters (ESC as \x1b), and mask what looks like a secret in
payloads and last_error: URL user info, query values, and the values of
keys such as Authorization, X-Api-Key, password or token. --json prints
the values as they are, masked the same way; --reveal turns masking off.
`

func jobsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "jobs", jobsUsage, map[string]commandFunc{
		"list": jobsList, "show": jobsShow, "retry": jobsRetry, "cancel": jobsCancel, "snooze": jobsSnooze,
	}, args, stdout, stderr)
}

func jobsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs list", "List jobs, newest first.", stderr)
	v := settings.New(fs, connSettings)
	status := fs.String("status", "", "comma-separated statuses: "+strings.Join(admin.Statuses, ", ")+" (default: all)")
	queue := fs.String("queue", "", "only this queue")
	kind := fs.String("kind", "", "only this kind")
	limit := fs.Int("limit", admin.DefaultLimit, "the most jobs to list")
	asJSON := fs.Bool("json", false, "print JSON")
	reveal := fs.Bool("reveal", false, revealHelp)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *limit <= 0 {
		return fmt.Errorf("--limit %d: must be above 0", *limit)
	}
	f := admin.Filter{Queue: *queue, Kind: *kind, Limit: *limit}
	for _, s := range strings.Split(*status, ",") {
		if s = strings.TrimSpace(s); s != "" {
			f.Statuses = append(f.Statuses, s)
		}
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		jobs, err := a.List(ctx, f)
		if err != nil {
			return err
		}
		if !*reveal {
			for i := range jobs {
				jobs[i].Mask()
			}
		}
		if *asJSON {
			return printJSON(stdout, jobs)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tQUEUE\tKIND\tSTATUS\tATTEMPTS\tRUN AT\tLAST ERROR")
		for _, j := range jobs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, termsafe.String(j.Queue), termsafe.String(j.Kind), j.Status, j.AttemptsText(),
				j.RunAt.UTC().Format(time.RFC3339), termsafe.String(oneLine(j.LastError, 80)))
		}
		return tw.Flush()
	})
}

// oneLine shortens s to n runes on one line.
func oneLine(s *string, n int) string {
	if s == nil {
		return ""
	}
	r := []rune(strings.Join(strings.Fields(*s), " "))
	if len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return string(r)
}

func jobsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs show", "Show one job, with its payload: pgdispatch jobs show [flags] ID", stderr)
	v := settings.New(fs, connSettings)
	asJSON := fs.Bool("json", false, "print JSON")
	reveal := fs.Bool("reveal", false, revealHelp)
	ids, err := parseIDs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return usageError(fs, "want exactly one job id")
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		j, err := a.Get(ctx, ids[0])
		if err != nil {
			return err
		}
		var masked bool
		if !*reveal {
			masked = j.Mask()
		}
		if *asJSON {
			return printJSON(stdout, j)
		}
		wait, err := a.FlowWait(ctx, j)
		if err != nil {
			return err
		}
		var payload bytes.Buffer
		if err := json.Indent(&payload, j.Payload, "  ", "  "); err != nil {
			payload.Reset()
			payload.Write(j.Payload)
		}
		str := func(s *string) string {
			if s == nil {
				return "-"
			}
			return *s
		}
		rows := [][2]string{
			{"id", strconv.FormatInt(j.ID, 10)},
			{"queue", j.Queue},
			{"kind", j.Kind},
			{"status", j.Status},
			{"attempts", j.AttemptsText()},
			{"priority", strconv.Itoa(int(j.Priority))},
			{"run_at", stampOr(&j.RunAt)},
			{"dedup_key", str(j.DedupKey)},
			{"locked_by", str(j.LockedBy)},
			{"locked_until", stampOr(j.LockedUntil)},
			{"created_at", stampOr(&j.CreatedAt)},
			{"updated_at", stampOr(&j.UpdatedAt)},
			{"finished_at", stampOr(j.FinishedAt)},
			{"last_error", str(j.LastError)},
		}
		if j.FlowKey != nil {
			rows = slices.Insert(rows, 8, [2]string{"flow key", *j.FlowKey})
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, row := range rows {
			fmt.Fprintf(tw, "%s\t%s\n", row[0], termsafe.String(row[1]))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if wait != "" {
			if _, err := fmt.Fprintf(stdout, "waiting: %s\n", termsafe.String(wait)); err != nil {
				return err
			}
		}
		if _, err := fmt.Fprintf(stdout, "payload\n  %s\n", termsafe.Lines(payload.String())); err != nil {
			return err
		}
		if err := printHistory(stdout, j); err != nil {
			return err
		}
		if masked {
			_, err = fmt.Fprintln(stdout, "(secrets masked as xxxxx: --reveal shows them)")
		}
		return err
	})
}

func jobsRetry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs retry", "Run dead or cancelled jobs again: pgdispatch jobs retry [flags] ID... | --all-dead [filters] [--yes]\n\n"+
		"--all-dead without --yes only counts the dead jobs the filters select.", stderr)
	v := settings.New(fs, connSettings)
	allDead := fs.Bool("all-dead", false, "every dead job (of the filters when given): count them, or retry them with --yes")
	dead := addDeadFlags(fs)
	ids, err := parseIDs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *allDead && len(ids) > 0:
		return errors.New("give job ids or --all-dead, not both")
	case !*allDead && dead.filtered():
		return errors.New("--queue, --kind, --since, --until and --host go with --all-dead")
	case !*allDead && len(ids) == 0:
		return usageError(fs, "give job ids, or --all-dead")
	case *allDead:
		return retryAllDead(ctx, v, fs, dead, stdout)
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		changes, err := a.Retry(ctx, ids)
		return printChanges(stdout, changes, err, "retried", "dead or cancelled")
	})
}

func jobsCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs cancel", "Cancel pending or running jobs: pgdispatch jobs cancel [flags] ID...", stderr)
	v := settings.New(fs, connSettings)
	ids, err := parseIDs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usageError(fs, "give job ids")
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		changes, err := a.Cancel(ctx, ids)
		return printChanges(stdout, changes, err, "cancelled", "pending or running")
	})
}

const revealHelp = "show secrets as they are: URL user info and query values, and the values of keys such as Authorization, X-Api-Key, password or token"

// printChanges prints what a command did to each job, and returns err, or
// else an error when it changed none of them (a command that did nothing
// exits non-zero) or an id matched no job.
func printChanges(w io.Writer, changes []admin.Change, err error, did, applies string) error {
	var changed int
	var missing []string
	for _, c := range changes {
		switch {
		case c.Changed:
			changed++
			fmt.Fprintf(w, "job %d: %s (was %s)\n", c.ID, did, c.Status)
		case c.Status == "":
			missing = append(missing, strconv.FormatInt(c.ID, 10))
			fmt.Fprintf(w, "job %d: not found\n", c.ID)
		default:
			fmt.Fprintf(w, "job %d: left as it is: %s, not %s\n", c.ID, c.Status, applies)
		}
	}
	switch {
	case err != nil:
		return err
	case changed == 0:
		verb, _, _ := strings.Cut(did, " ")
		return fmt.Errorf("no job was %s", verb)
	case len(missing) > 0:
		return fmt.Errorf("not found: job %s", strings.Join(missing, ", "))
	}
	return nil
}

// parseIDs parses flags and job ids, which may come before, between or
// after the flags.
func parseIDs(fs *flag.FlagSet, args []string) ([]int64, error) {
	names, err := parseNames(fs, args)
	ids := make([]int64, len(names))
	for i, name := range names {
		if ids[i], err = strconv.ParseInt(name, 10, 64); err != nil || ids[i] <= 0 {
			fmt.Fprintf(fs.Output(), "not a job id: %q\n", name)
			return nil, errUsage
		}
	}
	return ids, err
}

// withAdmin connects as v says, checks the schema, and runs f.
func withAdmin(ctx context.Context, v *settings.Values, f func(a *admin.Admin) error) error {
	return withConn(ctx, v, func(c *conn) error {
		if err := c.checkSchema(ctx); err != nil {
			return err
		}
		return f(admin.New(c.pool, c.schema, c.timeout))
	})
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

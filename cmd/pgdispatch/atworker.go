package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/pgdispatch/pgdispatch/atworker"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
)

const atWorkerUsage = `Usage:
  pgdispatch at-worker switch [--dry-run] [--table scheduled_tasks] [flags]   run the AT Worker's table on pgdispatch
  pgdispatch at-worker revert [--dry-run] [--table scheduled_tasks] [flags]   give it back to the AT Worker

switch renames the AT Worker's table to <table>_at_worker, makes each row a
job, and puts a view named <table> in its place: producers' INSERTs become
jobs in their own transaction, and the AT Worker's diagnostic SQL reads the
jobs' states under the AT Worker's names. revert makes it a table again,
with every row's current state, and cancels the pending jobs, which the AT
Worker runs from then on. See docs/migrating-from-at-worker.md.
`

func atWorkerCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "at-worker", atWorkerUsage, map[string]commandFunc{
		"switch": atWorkerSwitch, "revert": atWorkerRevert,
	}, args, stdout, stderr)
}

// The AT Worker's own settings. Each stands in for the pgdispatch setting
// named by StandsFor, a whole number above 0 read in Unit, when that one is
// unset (applyATWorkerSettings).
var atWorkerSettings = []settings.Setting{
	{Env: "WORKER_POLLING_INTERVAL", StandsFor: "POLL_INTERVAL", Unit: "s", Help: "seconds: read as `POLL_INTERVAL`, the fallback tick (a worker is woken by `NOTIFY` within milliseconds; the tick only covers a lost wake-up)"},
	{Env: "WORKER_BATCH_SIZE", StandsFor: "CONCURRENCY", Help: "read as `CONCURRENCY`: jobs run at once per queue, the largest claim"},
	{Env: "WORKER_CLEANER_INTERVAL", StandsFor: "SWEEP_INTERVAL", Unit: "m", Help: "minutes: read as `SWEEP_INTERVAL`"},
	{Env: "WORKER_STUCK_TIMEOUT", StandsFor: "LEASE", Unit: "m", Help: "minutes: read as `LEASE`, and by `at-worker switch` for rows being processed"},
}

// atWorkerValue is the value of the AT Worker's setting s, in s.Unit: ""
// when it is unset.
func atWorkerValue(v *settings.Values, s settings.Setting) (string, error) {
	from := v.Str(s.Env)
	if from == "" {
		return "", nil
	}
	if n, err := strconv.Atoi(from); err != nil || n <= 0 {
		return "", fmt.Errorf("invalid %s %q: must be a whole number above 0", s.Env, from)
	}
	return from + s.Unit, nil
}

// applyATWorkerSettings sets each pgdispatch setting that neither the
// environment nor a flag sets from the AT Worker's, and returns a log
// line's fields for each one it set.
func applyATWorkerSettings(v *settings.Values) (applied [][2]string, err error) {
	var errs []error
	for _, s := range atWorkerSettings {
		if v.Given(s.StandsFor) {
			continue
		}
		to, err := atWorkerValue(v, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w (it stands in for %s, which is unset)", err, s.StandsFor))
		} else if to != "" {
			v.Set(s.StandsFor, to)
			applied = append(applied, [2]string{s.Env + "=" + v.Str(s.Env), s.StandsFor + "=" + to})
		}
	}
	return applied, errors.Join(errs...)
}

func atWorkerSwitch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("at-worker switch", "Run the AT Worker's table on pgdispatch: rename it to <table>_at_worker, make every row a job,\n"+
		"and put a view named <table> with INSTEAD OF triggers in its place, in one transaction.\n"+
		"Pending rows are due at execute_at; rows an AT Worker is processing become due --stuck-timeout\n"+
		"after their updated_at, unless that AT Worker finishes them first. Running it again does nothing.", stderr)
	v := settings.New(fs, connSettings, atWorkerSettings)
	o := atWorkerFlags(fs)
	queue := fs.String("queue", atworker.DefaultQueue, "the queue of the jobs made from the table's rows")
	stuck := fs.Duration("stuck-timeout", 0, "how long after its updated_at a row the AT Worker is processing becomes due here (default: WORKER_STUCK_TIMEOUT minutes, else 5m)")
	if err := parse(fs, args); err != nil {
		return err
	}
	o.Queue, o.StuckTimeout = *queue, *stuck
	if o.StuckTimeout == 0 {
		stuck, err := atWorkerValue(v, settings.Only(atWorkerSettings, "WORKER_STUCK_TIMEOUT")[0])
		if err != nil {
			return err
		}
		o.StuckTimeout, _ = time.ParseDuration(cmp.Or(stuck, atworker.DefaultStuckTimeout.String()))
	}
	return onDatabase(ctx, v, o.LockWait, func(ctx context.Context, c *conn) error {
		o.Schema = c.schema
		plan, err := atworker.Switch(ctx, c.pool, *o)
		if err != nil {
			return atWorkerError(err, o.Table, "switch")
		}
		if plan.AlreadySwitched {
			fmt.Fprintf(stdout, "%s is already switched to pgdispatch (schema %q; its rows are in %s): nothing changed\n",
				termsafe.String(plan.Table), c.schema, termsafe.String(plan.Store))
			return nil
		}
		rows := termsafe.String(plan.Rows.String())
		if o.DryRun {
			fmt.Fprintf(stdout, "would switch %s, %s, to jobs of queue %q in schema %q; processing rows due %s after their updated_at;\n"+
				"the application's columns kept: %s. Nothing changed. The statements, in one transaction:\n\n",
				termsafe.String(plan.Table), rows, o.Queue, c.schema, o.StuckTimeout, termsafe.String(strings.Join(plan.Columns, ", ")))
			for _, s := range plan.Statements {
				for _, line := range strings.Split(s+";", "\n") {
					fmt.Fprintln(stdout, termsafe.String(line))
				}
				fmt.Fprintln(stdout)
			}
			return nil
		}
		fmt.Fprintf(stdout, "switched %s to pgdispatch: its %s are jobs of queue %q; the rows are kept in %s\n",
			termsafe.String(plan.Table), rows, o.Queue, termsafe.String(plan.Store))
		return nil
	})
}

func atWorkerRevert(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("at-worker revert", "Give the AT Worker's table back: make the view a table again with every row's current state,\n"+
		"and cancel the pending jobs, which the AT Worker runs from then on. Rows of jobs still running\n"+
		"read processing; revert waits up to --wait for their outcomes and writes them.", stderr)
	v := settings.New(fs, connSettings)
	o := atWorkerFlags(fs)
	wait := fs.Duration("wait", atworker.DefaultRevertWait, "how long to wait for the jobs running at the revert; those still running then are cancelled and their rows made pending")
	if err := parse(fs, args); err != nil {
		return err
	}
	return onDatabase(ctx, v, o.LockWait, func(callCtx context.Context, c *conn) error {
		o.Schema = c.schema
		res, err := atworker.Revert(callCtx, c.pool, *o)
		if err != nil {
			return atWorkerError(err, o.Table, "revert")
		}
		table, rows := termsafe.String(res.Table), termsafe.String(res.Rows.String())
		switch {
		case res.NotSwitched:
			fmt.Fprintf(stdout, "%s is a table already, not switched to pgdispatch: nothing changed\n", table)
			return nil
		case o.DryRun:
			fmt.Fprintf(stdout, "would revert %s (%s): %d pending jobs would be cancelled, %d running ones waited for. Nothing changed.\n",
				table, rows, res.Cancelled, len(res.Running))
			return nil
		}
		fmt.Fprintf(stdout, "reverted %s to a table (%s): %d pending jobs cancelled, for the AT Worker to run\n",
			table, rows, res.Cancelled)
		if len(res.Running) == 0 {
			return nil
		}
		fmt.Fprintf(stdout, "waiting up to %s for %d running jobs\n", *wait, len(res.Running))
		w, err := atworker.Wait(ctx, c.pool, c.schema, res.Table, res.Running, *wait, c.timeout)
		if err != nil {
			return fmt.Errorf("the table is reverted, but the outcomes of the running jobs were not all written: %w", err)
		}
		fmt.Fprintf(stdout, "%d finished and written; %d to be retried, made pending for the AT Worker", w.Finished, w.Retried)
		if len(w.Cut) > 0 {
			ids := make([]string, len(w.Cut))
			for i, c := range w.Cut {
				ids[i] = c.RowID
			}
			fmt.Fprintf(stdout, "; %d still running were cancelled and their rows made pending (an attempt cut short may have delivered): ids %s of %s",
				len(w.Cut), termsafe.String(strings.Join(ids, ", ")), table)
		}
		fmt.Fprintln(stdout)
		return nil
	})
}

func atWorkerFlags(fs *flag.FlagSet) *atworker.Options {
	o := &atworker.Options{}
	fs.StringVar(&o.Table, "table", atworker.DefaultTable, "the AT Worker's table, as SQL reads it: scheduled_tasks (on the search_path) or app.scheduled_tasks")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print what would be done, and change nothing")
	fs.DurationVar(&o.LockWait, "lock-wait", atworker.DefaultLockWait, "how long to wait for the table's lock; producers queue behind the wait, so keep it short")
	return o
}

// atWorkerError makes a missing table one clear line.
func atWorkerError(err error, table, what string) error {
	if errors.Is(err, atworker.ErrNoTable) {
		return fmt.Errorf("no table %s in this database (nor on its search_path): nothing to %s", termsafe.String(table), what)
	}
	return err
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
)

const schedulesUsage = `Usage:
  pgdispatch schedules add NAME (--cron EXPR | --every D) --kind K [--payload JSON] [--queue Q]
                           [--time-zone TZ] [--priority N] [--max-attempts N] [--catch-up skip|all] [--catch-up-limit N]
  pgdispatch schedules list [--json] [--reveal]
  pgdispatch schedules remove NAME
  pgdispatch schedules pause NAME
  pgdispatch schedules resume NAME

A schedule creates a job at each of its slots: the times a cron expression
(five fields, or @hourly, @daily, @weekly, @monthly, @yearly) names in a
time zone, or the multiples of an interval. Every worker fires due
schedules, one job per slot whatever the number of workers. add declares
a schedule, or changes the one of that name (the flags left out keep
their values); the expression and time zone are checked as the workers
read them. After downtime, --catch-up skip creates one job and all one
per missed slot. pause stops a schedule; resume starts it again from its
next slot. list shows each schedule's next and last run, its missed,
caught-up and taken slots (a taken slot's key was held by another job, so
none was created), with the payloads' secrets masked unless --reveal.
Run 'pgdispatch schedules COMMAND --help' for the flags.
`

func schedulesCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "schedules", schedulesUsage, map[string]commandFunc{
		"add": schedulesAdd, "list": schedulesList, "remove": schedulesRemove,
		"pause": schedulesPause, "resume": schedulesResume,
	}, args, stdout, stderr)
}

// builtinKinds are the kinds of pgdispatch's own executors.
var builtinKinds = []string{httpcallback.Kind, rabbitmq.Kind, email.Kind, executors.KindNoop}

// parseNames parses flags and the names among them, before, between or
// after the flags.
func parseNames(fs *flag.FlagSet, args []string) (names []string, err error) {
	for {
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			return nil, err
		} else if err != nil {
			return nil, errUsage
		}
		if fs.NArg() == 0 {
			return names, nil
		}
		names, args = append(names, fs.Arg(0)), fs.Args()[1:]
	}
}

// oneName parses flags and exactly one name of a noun (a schedule, a
// queue).
func oneName(fs *flag.FlagSet, args []string, noun string) (string, error) {
	names, err := parseNames(fs, args)
	if err != nil {
		return "", err
	}
	if len(names) != 1 || names[0] == "" {
		return "", usageError(fs, "give one %s name", noun)
	}
	return names[0], nil
}

func schedulesAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("schedules add", "Declare a schedule, or change the one of that name: pgdispatch schedules add NAME --cron EXPR --kind K [flags]", stderr)
	v := settings.New(fs, connSettings)
	cron := fs.String("cron", "", "five fields (minute hour day-of-month month day-of-week) or @hourly, @daily, @weekly, @monthly, @yearly")
	every := fs.Duration("every", 0, "an interval of whole seconds instead of --cron, such as 30s or 1h (slots at its multiples since 1970-01-01 UTC)")
	tz := fs.String("time-zone", "", "the IANA time zone --cron is read in, such as Europe/Berlin; empty: UTC for a new schedule")
	kind := fs.String("kind", "", "the jobs' kind: http_callback, rabbitmq, email, noop or a custom one (required for a new schedule)")
	payload := fs.String("payload", "", "the jobs' payload, as JSON; empty: {} for a new schedule")
	queue := fs.String("queue", "", "the jobs' queue; empty: default for a new schedule")
	priority := fs.Int("priority", 0, "the jobs' priority, smaller first; left out: 0 for a new schedule")
	maxAttempts := fs.Int("max-attempts", 0, "the jobs' attempts; 0: the worker's MAX_ATTEMPTS")
	catchUp := fs.String("catch-up", "", "after downtime: skip creates one job, all one per missed slot; empty: skip for a new schedule")
	catchUpLimit := fs.Int("catch-up-limit", 0, "the most jobs all creates for missed slots, the latest ones; 0: 100 for a new schedule")
	name, err := oneName(fs, args, "schedule")
	if err != nil {
		return err
	}
	spec := admin.ScheduleSpec{
		Name: name, Cron: *cron, Every: *every, TimeZone: *tz, Kind: *kind, Queue: *queue,
		MaxAttempts: *maxAttempts, CatchUp: *catchUp, CatchUpLimit: *catchUpLimit,
	}
	if *payload != "" {
		spec.Payload = json.RawMessage(*payload)
	}
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "priority" {
			p := int16(*priority) //nolint:gosec // checked here
			spec.Priority = &p
			errs = append(errs, refuse(*priority < math.MinInt16 || *priority > math.MaxInt16, "--priority must fit in a smallint"))
		}
		errs = append(errs, refuse(f.Name == "max-attempts" && *maxAttempts <= 0, "--max-attempts must be above 0"),
			refuse(f.Name == "catch-up-limit" && *catchUpLimit <= 0, "--catch-up-limit must be above 0"))
	})
	if err := spec.Check(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("schedule %s: %w", termsafe.String(name), err)
	}
	if !slices.Contains(builtinKinds, *kind) {
		fmt.Fprintf(stderr, "warning: kind %s is none of pgdispatch's executors (http_callback, rabbitmq, email, noop): "+
			"a worker must have an executor registered for it, or its jobs die\n", termsafe.String(*kind))
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		created, err := a.Declare(ctx, spec)
		if err != nil {
			return err
		}
		if created {
			fmt.Fprintf(stdout, "schedule %s: added\n", termsafe.String(name))
		} else {
			fmt.Fprintf(stdout, "schedule %s: declared (changed only where it differed)\n", termsafe.String(name))
		}
		return nil
	})
}

func schedulesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("schedules list", "List the schedules: their timing, job, next and last run, and missed and caught-up slots.", stderr)
	v := settings.New(fs, connSettings)
	asJSON := fs.Bool("json", false, "print JSON")
	reveal := fs.Bool("reveal", false, revealHelp)
	if err := parse(fs, args); err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		list, err := a.Schedules(ctx)
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
		return printSchedules(stdout, list, true)
	})
}

// printSchedules prints the schedules as a table, with their errors
// below; with details, their zone, job and catch-up policy too.
func printSchedules(w io.Writer, list []admin.Schedule, details bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if details {
		fmt.Fprint(tw, "SCHEDULE\tTIMING\tZONE\tKIND\tQUEUE\tCATCH-UP\tSTATE\tNEXT RUN\tLAST RUN\tRUNS\tMISSED\tCAUGHT UP\tTAKEN\tPAYLOAD\n")
	} else {
		fmt.Fprint(tw, "SCHEDULE\tTIMING\tSTATE\tNEXT RUN\tLAST RUN\tRUNS\tMISSED\tCAUGHT UP\tTAKEN\n")
	}
	var broken, warned []admin.Schedule
	for _, s := range list {
		if s.Warning != nil {
			warned = append(warned, s)
		}
		state := "enabled"
		switch {
		case s.Error != nil:
			state = "error (below)"
			broken = append(broken, s)
		case !s.Enabled:
			state = "paused"
		}
		next := "-"
		switch {
		case s.NextRunAt != nil && s.Enabled:
			next = s.NextRunAt.UTC().Format(time.RFC3339)
		case s.Enabled && s.Error == nil:
			next = "(a worker computes it)"
		}
		last := "-"
		if s.LastRunAt != nil {
			last = s.LastRunAt.UTC().Format(time.RFC3339)
		}
		counts := strconv.FormatInt(s.Runs, 10) + "\t" + strconv.FormatInt(s.Missed, 10) + "\t" + strconv.FormatInt(s.CaughtUp, 10) +
			"\t" + strconv.FormatInt(s.Taken, 10)
		if details {
			catchUp := s.CatchUp
			if catchUp == "all" {
				catchUp += " (" + strconv.Itoa(int(s.CatchUpLimit)) + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", termsafe.String(s.Name), termsafe.String(s.Timing()),
				termsafe.String(s.TimeZone), termsafe.String(s.Kind), termsafe.String(s.Queue), catchUp, state, next, last, counts,
				termsafe.String(string(compact(s.Payload))))
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", termsafe.String(s.Name), termsafe.String(s.Timing()), state, next, last, counts)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range broken {
		fmt.Fprintf(w, "schedule %s: %s\n", termsafe.String(s.Name), termsafe.String(*s.Error))
	}
	for _, s := range warned {
		fmt.Fprintf(w, "schedule %s: warning: %s\n", termsafe.String(s.Name), termsafe.String(*s.Warning))
	}
	return nil
}

func schedulesRemove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("schedules remove", "Delete a schedule; the jobs it created stay: pgdispatch schedules remove NAME", stderr)
	v := settings.New(fs, connSettings)
	name, err := oneName(fs, args, "schedule")
	if err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		found, err := a.Unschedule(ctx, name)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("schedule %s: %w", termsafe.String(name), admin.ErrNoSchedule)
		}
		fmt.Fprintf(stdout, "schedule %s: removed\n", termsafe.String(name))
		return nil
	})
}

func schedulesPause(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return toggle(ctx, toggleCommand{
		noun: "schedule", verb: "pause", set: (*admin.Admin).PauseSchedule,
		help: "Stop a schedule from creating jobs until it is resumed: pgdispatch schedules pause NAME",
	}, args, stdout, stderr)
}

func schedulesResume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return toggle(ctx, toggleCommand{
		noun: "schedule", verb: "resume", set: (*admin.Admin).ResumeSchedule,
		help: "Start a paused schedule again from its next slot (the paused slots are not caught up): pgdispatch schedules resume NAME",
	}, args, stdout, stderr)
}

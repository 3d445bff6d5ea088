// Command pgdispatch runs pgdispatch workers and manages their schema.
//
//	pgdispatch run        serve the queues until SIGINT or SIGTERM
//	pgdispatch migrate    create or upgrade the schema
//	pgdispatch enqueue    add a job
//	pgdispatch demo       deliver sample jobs to receivers in the process, printing each attempt
//	pgdispatch bench      measure latency, throughput, writer overhead and idle cost
//	pgdispatch triggers   add, list and remove dispatch triggers on any table
//	pgdispatch stats      jobs by queue, kind and status
//	pgdispatch jobs       look at jobs and their attempts; retry, cancel or snooze them
//	pgdispatch queues     pause and resume queues
//	pgdispatch schedules  add, list, remove, pause and resume cron schedules
//	pgdispatch limits     set, list and clear flow limits by key
//	pgdispatch secrets    rotate and list the secrets that sign http_callback requests
//	pgdispatch endpoints  list the receivers of http_callback jobs, their circuit breakers and events; disable and enable them
//	pgdispatch at-worker  run the AT Worker's table on pgdispatch, and give it back
//	pgdispatch console    serve the web console
//
// Configuration comes from the environment, an optional .env file in the
// working directory, and flags; flags win. `pgdispatch COMMAND --help` lists
// each command's flags with the variables they override.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/joho/godotenv"

	"github.com/pgdispatch/pgdispatch/internal/redact"
)

const usage = `pgdispatch dispatches jobs from PostgreSQL with low latency.

Usage:
  pgdispatch run [flags]       serve the queues until SIGINT or SIGTERM
  pgdispatch migrate [flags]   create or upgrade the schema
  pgdispatch enqueue [flags]   add a job
  pgdispatch demo [flags]      deliver sample webhooks and mail to receivers in the process, printing each attempt
  pgdispatch bench [flags]     measure latency, throughput, writer overhead and idle cost
  pgdispatch triggers add|list|remove   dispatch jobs from row changes in any table
  pgdispatch stats [flags]     jobs by queue, kind and status, the oldest due job, the last minute's throughput
  pgdispatch jobs list|show|retry|cancel|snooze   look at jobs and their attempts, retry dead ones, cancel or snooze others
  pgdispatch queues list|pause|resume   pause a queue's claims on every worker, and resume them
  pgdispatch schedules add|list|remove|pause|resume   create jobs on a cron schedule or an interval, once per slot
  pgdispatch limits set|list|clear   flow control: limit a queue's keys' concurrency, order and rate
  pgdispatch secrets rotate|list   rotate the secrets that sign http_callback requests, with an overlap, without a restart
  pgdispatch endpoints list|events|disable|enable|note   the receivers of http_callback jobs, their circuit breakers and events; disable and enable them
  pgdispatch at-worker switch|revert   run the AT Worker's scheduled_tasks on pgdispatch, producers and SQL unchanged, and give it back
  pgdispatch console [flags]   serve the web console: queues, workers, jobs, schedules, live, with actions

Run 'pgdispatch COMMAND --help' for a command's flags. Every flag can also be
set by the environment variable named in its help, or in a .env file.
`

type commandFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// subcommand runs the subcommand of name that args[0] names, or prints
// usage.
func subcommand(ctx context.Context, name, usage string, subs map[string]commandFunc, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	if f, ok := subs[args[0]]; ok {
		return f(ctx, args[1:], stdout, stderr)
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "unknown %s command %q\n\n%s", name, args[0], usage)
	return errUsage
}

var commands = map[string]commandFunc{
	"run": runCommand, "migrate": migrateCommand, "enqueue": enqueueCommand, "demo": demoCommand, "bench": benchCommand,
	"triggers": triggersCommand, "stats": statsCommand, "jobs": jobsCommand, "queues": queuesCommand,
	"schedules": schedulesCommand, "limits": limitsCommand, "secrets": secretsCommand, "endpoints": endpointsCommand, "at-worker": atWorkerCommand, "console": consoleCommand,
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	// Everything printed, logs included, goes through the filter.
	secrets := &redact.Filter{}
	secrets.AddEnv(os.Environ())
	secrets.AddArgs(args)
	stdout, stderr = secrets.Writer(stdout), secrets.Writer(stderr)
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "pgdispatch: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err := godotenv.Load(); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stderr, "pgdispatch: read .env: %v\n", err)
		return 1
	}
	secrets.AddEnv(os.Environ()) // and what .env set
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopOnClosedOutput(ctx, stop)
	// The first signal starts a graceful shutdown; restoring the default
	// handling lets a second one end the process at once.
	go func() { <-ctx.Done(); stop() }()
	err := cmd(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "pgdispatch %s: %v\n", args[0], err)
		return 1
	}
}

// errUsage is returned after a flag error was already printed.
var errUsage = errors.New("usage")

func newFlagSet(name, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("pgdispatch "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: pgdispatch %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		return usageError(fs, "unexpected arguments: %v", fs.Args())
	}
	return nil
}

// refuse is an error that says what is wrong when wrong holds, for
// errors.Join, which leaves out the nil ones.
func refuse(wrong bool, format string, args ...any) error {
	if wrong {
		return fmt.Errorf(format, args...)
	}
	return nil
}

// usageError prints what is wrong with a command line, and the usage.
func usageError(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(fs.Output(), format+"\n", args...)
	fs.Usage()
	return errUsage
}

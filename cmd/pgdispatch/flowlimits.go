package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
)

const limitsUsage = `Usage:
  pgdispatch limits set [flags] QUEUE
  pgdispatch limits list [--queue Q] [--json]
  pgdispatch limits clear [--key K] QUEUE

set declares the flow limits of a key of a queue (--key), or of every key
of it, replacing the ones declared before, and wakes the queue's workers:
--concurrency N jobs of a key running at once, --strict to start a key's
jobs one at a time in order, --rate N --per D starts of a key in any window
of D. A limit for an exact key overrides the queue's limit for every key.
With none of them, the queue's keys only take turns. clear removes the
limits of a key, or the queue's limit for every key, and exits 1 when there
were none. See docs/operations.md, "Flow control".
Run 'pgdispatch limits COMMAND --help' for the flags.
`

func limitsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "limits", limitsUsage, map[string]commandFunc{
		"set": limitsSet, "list": limitsList, "clear": limitsClear,
	}, args, stdout, stderr)
}

func limitsSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("limits set", "Declare the flow limits of a queue's keys: pgdispatch limits set [flags] QUEUE", stderr)
	v := settings.New(fs, connSettings)
	var l admin.FlowLimit
	fs.StringVar(&l.Key, "key", "", "the flow key; empty: every key of the queue")
	fs.IntVar(&l.Concurrency, "concurrency", 0, "at most this many jobs of a key running at once (1 to 100000); 0: no limit")
	fs.BoolVar(&l.Strict, "strict", false, "start a key's jobs one at a time, in (priority, run_at, id) order")
	fs.IntVar(&l.Rate, "rate", 0, "at most this many starts of a key (1 to 10000) in any window of --per; 0: no limit")
	fs.DurationVar(&l.Per, "per", 0, "the rate's window, such as 1s or 1m (at most 24h)")
	queue, err := oneName(fs, args, "queue")
	if err != nil {
		return err
	}
	if err := errors.Join(
		refuse(l.Concurrency < 0, "--concurrency must be positive"),
		refuse(l.Rate < 0 || l.Per < 0, "--rate and --per must be positive"),
		refuse((l.Rate == 0) != (l.Per == 0), "--rate and --per go together"),
	); err != nil {
		return err
	}
	l.Queue = queue
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		if err := a.SetFlowLimit(ctx, l); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "queue %s, %s: %s\n", termsafe.String(queue), keyName(l.Key), describeLimit(l))
		return nil
	})
}

func limitsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("limits list", "List the flow limits.", stderr)
	v := settings.New(fs, connSettings)
	queue := fs.String("queue", "", "only this queue's limits")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		limits, err := a.FlowLimits(ctx, *queue)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, limits)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "QUEUE\tKEY\tCONCURRENCY\tSTRICT\tRATE")
		for _, l := range limits {
			key, concurrency, strict, rate := "every key", "-", "no", "-"
			if l.Key != "" {
				key = termsafe.String(l.Key)
			}
			if l.Concurrency > 0 {
				concurrency = strconv.Itoa(l.Concurrency)
			}
			if l.Strict {
				strict = "yes"
			}
			if l.Rate > 0 {
				rate = fmt.Sprintf("%d per %s", l.Rate, l.Per)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", termsafe.String(l.Queue), key, concurrency, strict, rate)
		}
		return tw.Flush()
	})
}

func limitsClear(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("limits clear", "Remove the flow limits of a key, or of every key, of a queue: pgdispatch limits clear [--key K] QUEUE", stderr)
	v := settings.New(fs, connSettings)
	key := fs.String("key", "", "the flow key; empty: the queue's limit for every key (the exact keys' limits stay)")
	queue, err := oneName(fs, args, "queue")
	if err != nil {
		return err
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		removed, err := a.ClearFlowLimit(ctx, queue, *key)
		if err != nil {
			return err
		}
		if !removed {
			fmt.Fprintf(stdout, "queue %s, %s: no limit\n", termsafe.String(queue), keyName(*key))
			return errNothingChanged
		}
		fmt.Fprintf(stdout, "queue %s, %s: limit cleared\n", termsafe.String(queue), keyName(*key))
		return nil
	})
}

func keyName(key string) string {
	if key == "" {
		return "every key"
	}
	return "key " + termsafe.String(key)
}

func describeLimit(l admin.FlowLimit) string {
	var parts []string
	if l.Concurrency > 0 {
		parts = append(parts, fmt.Sprintf("at most %d running", l.Concurrency))
	}
	if l.Strict {
		parts = append(parts, "strict order")
	}
	if l.Rate > 0 {
		parts = append(parts, fmt.Sprintf("at most %d starts per %s", l.Rate, l.Per))
	}
	if len(parts) == 0 {
		return "takes turns with the other keys"
	}
	out := parts[0]
	for _, p := range parts[1:] {
		out += ", " + p
	}
	return out
}

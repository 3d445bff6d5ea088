package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/termsafe"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// deadFlags are the filters of jobs retry --all-dead.
type deadFlags struct {
	queue, kind, host string
	since, until      admin.Moment
	yes               bool
}

// shownIDs is how many ids a dry run prints.
const shownIDs = 10

func addDeadFlags(fs *flag.FlagSet) *deadFlags {
	d := &deadFlags{}
	fs.StringVar(&d.queue, "queue", "", "with --all-dead: only this queue")
	fs.StringVar(&d.kind, "kind", "", "with --all-dead: only this kind")
	fs.TextVar(&d.since, "since", admin.Moment{}, "with --all-dead: only jobs that died at or after this `time`: RFC 3339 (2026-05-01T10:00:00Z) or a duration ago (2h)")
	fs.TextVar(&d.until, "until", admin.Moment{}, "with --all-dead: only jobs that died before this `time`: RFC 3339 or a duration ago")
	fs.StringVar(&d.host, "host", "", "with --all-dead: only http_callback jobs whose url has this host (name or IP, any case; with :port, that port too)")
	fs.BoolVar(&d.yes, "yes", false, "with --all-dead: retry the jobs; without it, only count them")
	return d
}

// filtered reports whether a filter of --all-dead was given.
func (d *deadFlags) filtered() bool {
	return d.queue != "" || d.kind != "" || d.host != "" || !d.since.IsZero() || !d.until.IsZero()
}

// check refuses what is wrong before a connection is made.
func (d *deadFlags) check() error {
	if d.host == "" {
		return nil
	}
	if d.kind != "" && d.kind != httpcallback.Kind {
		return fmt.Errorf("--host selects %s jobs: it cannot go with --kind %s", httpcallback.Kind, termsafe.String(d.kind))
	}
	if err := (admin.DeadFilter{Host: d.host}).Validate(); err != nil {
		return fmt.Errorf("--%s", termsafe.String(err.Error()))
	}
	return nil
}

// retryAllDead counts the dead jobs d selects, or with --yes retries them.
func retryAllDead(ctx context.Context, v *settings.Values, fs *flag.FlagSet, d *deadFlags, stdout io.Writer) error {
	if err := d.check(); err != nil {
		return usageError(fs, "%v", err)
	}
	return withAdmin(ctx, v, func(a *admin.Admin) error {
		window, err := a.Resolve(ctx, d.since, d.until)
		if err != nil {
			return err
		}
		f := admin.DeadFilter{Queue: d.queue, Kind: d.kind, Host: d.host, Since: window[0], Until: window[1]}
		if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
			return usageError(fs, "--since (%s) must be before --until (%s)", stamp(f.Since), stamp(f.Until))
		}
		if d.yes {
			n, err := a.RetryDeadMatching(ctx, f)
			fmt.Fprintf(stdout, "%d dead jobs retried\n", n)
			if err == nil && n == 0 {
				err = errors.New("no dead job matched: nothing was retried")
			}
			return err
		}
		c, err := a.CountDead(ctx, f, shownIDs)
		if err != nil {
			return err
		}
		if c.Count == 0 {
			fmt.Fprintln(stdout, "0 dead jobs match: nothing to retry")
			return nil
		}
		ids := make([]string, len(c.FirstIDs))
		for i, id := range c.FirstIDs {
			ids[i] = strconv.FormatInt(id, 10)
		}
		more := ""
		if rest := c.Count - int64(len(ids)); rest > 0 {
			more = fmt.Sprintf(" and %d more", rest)
		}
		fmt.Fprintf(stdout, "%d dead jobs match: %s%s\n", c.Count, strings.Join(ids, ", "), more)
		fmt.Fprintf(stdout, "Dry run: nothing was changed. To retry them, run (with the same connection settings):\n  %s\n",
			termsafe.String(retryCommand(f)))
		return nil
	})
}

// retryCommand is the command that retries what f selects, its times as
// they were resolved.
func retryCommand(f admin.DeadFilter) string {
	cmd := []string{"pgdispatch", "jobs", "retry", "--all-dead"}
	for _, o := range []struct{ flag, value string }{{"queue", f.Queue}, {"kind", f.Kind}, {"host", f.Host}} {
		if o.value != "" {
			cmd = append(cmd, "--"+o.flag, endpoints.ShellArg(o.value))
		}
	}
	if !f.Since.IsZero() {
		cmd = append(cmd, "--since", stamp(f.Since))
	}
	if !f.Until.IsZero() {
		cmd = append(cmd, "--until", stamp(f.Until))
	}
	return strings.Join(append(cmd, "--yes"), " ")
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// stampOr is stamp(*t), or "-" when t is nil.
func stampOr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}

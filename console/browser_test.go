package console

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// browserTimeout bounds each step a browser takes; a step that waits for a
// change ends as soon as the change shows.
const browserTimeout = 20 * time.Second

// chromiumPath finds Debian's chromium. Without it the browser tests skip,
// and fail under CI=true, where .ci/run installs it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: the console's browser tests need headless Chromium (apt-get install chromium); under CI=true they fail without it")
	}
	t.Skip("no chromium on PATH: the console's browser tests need headless Chromium (apt-get install chromium); skipped outside CI")
	return ""
}

// browser is a headless Chromium tab signed in to the console, and what the
// pages did that no page of the console should: a dialog, an exception, an
// error on the console (a script the Content-Security-Policy refused
// included).
type browser struct {
	ctx context.Context

	mu        sync.Mutex
	incidents []string
}

func newBrowser(t *testing.T, name, token string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.WindowSize(1280, 800),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &browser{}
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithListener(b.listen))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	b.ctx = ctx
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":"+token))
	_, err := chromedp.Run(ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
			Headers: network.Headers{"Authorization": auth},
		})
		return chromedp.Void{}, err
	})
	require.NoError(t, err, "start chromium")
	return b
}

func (b *browser) listen(ev any) {
	var incident string
	switch ev := ev.(type) {
	case *cdppage.EventJavascriptDialogOpening:
		incident = fmt.Sprintf("a %s dialog opened: %q", ev.Type, ev.Message)
	case *runtime.EventExceptionThrown:
		incident = "an exception: " + ev.ExceptionDetails.Text
		if ev.ExceptionDetails.Exception != nil {
			incident += " " + ev.ExceptionDetails.Exception.Description
		}
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
			incident = fmt.Sprintf("console.%s from the page", ev.Type)
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError {
			incident = "a console error: " + ev.Entry.Text
		}
	}
	if incident != "" {
		b.mu.Lock()
		b.incidents = append(b.incidents, incident)
		b.mu.Unlock()
	}
}

// do runs steps, each within browserTimeout.
func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...), what)
}

func (b *browser) eval(t *testing.T, expr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	require.NoError(t, err, expr)
	return s
}

// waitFor waits until the JavaScript condition holds, through the
// navigations a form's submission starts.
func (b *browser) waitFor(t *testing.T, what, cond string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingTimeout(browserTimeout)))
		if err == nil {
			return
		}
		// The page the poll ran in went away: poll the next one.
		if ctx.Err() == nil && navigated(err) {
			continue
		}
		require.NoError(t, err, what)
	}
}

// navigated reports whether err says the page an action ran in went away:
// "Cannot find context with specified id", "Inspected target navigated or
// closed", "Execution context was destroyed".
func navigated(err error) bool {
	for _, m := range []string{"Cannot find context", "navigated or closed", "context was destroyed"} {
		if strings.Contains(err.Error(), m) {
			return true
		}
	}
	return false
}

func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := "/tmp/console-" + name + ".png"
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s", path)
}

func (b *browser) noIncidents(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(t, b.incidents, "the pages did what no page of the console should")
}

// js quotes s as a JavaScript string.
func js(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(s) + "'"
}

// hostile is what a row may hold: markup, script, javascript: URLs and
// terminal escapes.
const hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>javascript:alert(3)\x1b[31m"

// One browser goes through the console as an operator, and writes a
// screenshot of each page: the overview shows a queue's counts and follows
// an INSERT without a reload; pausing a queue pauses it, and resuming it
// resumes it; a filter narrows the jobs; retrying a dead job from the list
// makes it pending in the table, and cancelling one from its page cancels
// it; a job's page masks its secrets; the confirmation of an action on
// every job a filter selects counts them, and the action changes them; a
// schedule pauses; and rows full of markup show as text, with no script
// run.
func TestBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, run_at, locked_by, locked_until, finished_at, last_error, payload) VALUES
		('mail', 'email', 'pending', now() - interval '3 seconds', NULL, NULL, NULL, NULL, '{}'),
		('mail', 'email', 'pending', now(), NULL, NULL, NULL, NULL, '{}'),
		('mail', 'email', 'pending', now() + interval '1 hour', NULL, NULL, NULL, NULL, '{}'),
		('mail', 'email', 'running', now(), 'worker-a', now() + interval '1 minute', NULL, NULL, '{}'),
		('mail', 'email', 'dead', now(), NULL, NULL, now(), 'dial tcp 10.0.0.1:25: connection refused', '{}'),
		('hooks', 'http_callback', 'dead', now(), NULL, NULL, now(), 'receiver answered 500',
		 '{"url": "https://user:hunter2pass@example.com/hook?token=abcdef123", "headers": {"Authorization": "Bearer s3cr3t-value"}}'),
		('hooks', 'http_callback', 'done', now(), NULL, NULL, now(), NULL, '{}')`)
	refused := b.queryInt(t, `SELECT id FROM {jobs} WHERE last_error LIKE '%refused'`)
	secret := b.queryInt(t, `SELECT id FROM {jobs} WHERE last_error = 'receiver answered 500'`)
	later := b.queryInt(t, `SELECT id FROM {jobs} WHERE run_at > now() + interval '1 minute'`)

	br := newBrowser(t, "ann", operatorToken)
	mailCell := func(f string) string {
		return `document.querySelector('#queues tr[data-queue="mail"] [data-f="` + f + `"]')`
	}

	// The overview: the queue's counts, the worker and what it runs.
	br.do(t, "open the overview", chromedp.Navigate(b.url), chromedp.WaitVisible("#queues"))
	require.Equal(t, "3", br.eval(t, mailCell("pending")+".textContent"))
	require.Equal(t, "2", br.eval(t, mailCell("due")+".textContent"))
	require.Equal(t, "1", br.eval(t, mailCell("running")+".textContent"))
	require.Contains(t, br.eval(t, `document.querySelector('#workers').innerText`), "worker-a")

	// Live: an INSERT shows without a reload.
	br.waitFor(t, "the live updates connect", `document.querySelector('#live.on') !== null`)
	br.eval(t, `window.notReloaded = "yes"; ""`)
	start := time.Now()
	b.exec(t, `INSERT INTO {jobs} (queue, kind) VALUES ('mail', 'email')`)
	br.waitFor(t, "the new job's count", mailCell("pending")+`.textContent === "4"`)
	t.Logf("an INSERT showed on the overview %s after it", time.Since(start).Round(time.Millisecond))
	require.Equal(t, "yes", br.eval(t, `window.notReloaded`), "the page was not reloaded")

	// Pause the queue from the overview.
	br.do(t, "pause mail", chromedp.Click(`#queues tr[data-queue="mail"] button[value="pause"]`), chromedp.WaitVisible(".flash"))
	require.EqualValues(t, 1, b.queryInt(t, `SELECT count(*) FROM {schema}.queues WHERE name = 'mail' AND paused_at IS NOT NULL`))
	require.Contains(t, br.eval(t, `document.querySelector('.flash').textContent`), `paused`)

	// The jobs list, and a filter that narrows it.
	br.do(t, "open the jobs", chromedp.Navigate(b.url+"jobs"), chromedp.WaitVisible("#rows"))
	require.Equal(t, "8", br.eval(t, `String(document.querySelectorAll('#rows tr[data-id]').length)`))
	// The list follows the table too.
	br.waitFor(t, "the live updates connect", `document.querySelector('#live.on') !== null`)
	br.eval(t, `window.notReloaded = "yes"; ""`)
	b.exec(t, `INSERT INTO {jobs} (queue, kind) VALUES ('hooks', 'live-row')`)
	br.waitFor(t, "the new row", `document.querySelectorAll('#rows tr[data-id]').length === 9`)
	require.Contains(t, br.eval(t, `document.querySelector('#rows tr[data-id]').textContent`), "live-row", "newest first")
	require.Equal(t, "yes", br.eval(t, `window.notReloaded`), "the page was not reloaded")
	br.eval(t, `window.unfiltered = "yes"; ""`)
	br.do(t, "filter by error text",
		chromedp.SetValue(`#filters input[name="error"]`, "refused"),
		chromedp.Click(`#filters input[name="status"][value="dead"]`),
		chromedp.Submit(`#filters`))
	br.waitFor(t, "the narrowed list", `window.unfiltered === undefined && document.readyState === "complete" && document.querySelectorAll('#rows tr[data-id]').length === 1`)
	require.Equal(t, fmt.Sprint(refused), br.eval(t, `document.querySelector('#rows tr[data-id]').dataset.id`))

	// Retry the dead job from the list: the row changes in the table.
	br.do(t, "retry the selected job",
		chromedp.Click(`#rows input[type="checkbox"][value="`+fmt.Sprint(refused)+`"]`),
		chromedp.Click(`#act button[value="retry"]`),
		chromedp.WaitVisible(".flash"))
	require.Contains(t, br.eval(t, `document.querySelector('.flash').textContent`), "retried 1 job")
	require.Equal(t, "pending", b.queryString(t, `SELECT status FROM {jobs} WHERE id = $1`, refused))
	br.do(t, "open the jobs again", chromedp.Navigate(b.url+"jobs"), chromedp.WaitVisible("#rows"))
	br.screenshot(t, "jobs")

	// Cancel a job from its page.
	br.do(t, "cancel a job",
		chromedp.Navigate(fmt.Sprintf("%sjobs/%d", b.url, later)),
		chromedp.Click(`form.actions button[value="cancel"]`),
		chromedp.WaitVisible(".flash"))
	require.Contains(t, br.eval(t, `document.querySelector('.flash').textContent`), "cancelled 1 job")
	require.Equal(t, "cancelled", b.queryString(t, `SELECT status FROM {jobs} WHERE id = $1`, later))

	// A job's page masks the payload's secrets.
	br.do(t, "open a job", chromedp.Navigate(fmt.Sprintf("%sjobs/%d", b.url, secret)), chromedp.WaitVisible("#payload"))
	payload := br.eval(t, `document.querySelector('#payload').textContent`)
	require.NotContains(t, payload, "hunter2pass")
	require.NotContains(t, payload, "s3cr3t-value")
	require.Contains(t, payload, "xxxxx")
	br.screenshot(t, "job")

	// Snooze every pending job of the queue: the count first, then the
	// action.
	br.do(t, "open the confirmation", chromedp.Navigate(b.url+"bulk?action=snooze&queue=mail&status=pending"), chromedp.WaitVisible("#count"))
	require.Equal(t, "4", br.eval(t, `document.querySelector('#count').textContent`), "two seeded, one inserted, one retried")
	br.screenshot(t, "bulk")
	br.do(t, "confirm", chromedp.Click(`#confirm`), chromedp.WaitVisible(".flash"))
	require.Contains(t, br.eval(t, `document.querySelector('.flash').textContent`), "snoozed 4 jobs")
	require.EqualValues(t, 0, b.queryInt(t, `SELECT count(*) FROM {jobs} WHERE queue = 'mail' AND status = 'pending' AND run_at < now() + interval '30 minutes'`))

	// The last hour's chart (a bar for each of the 60 minutes, but those
	// a turn of the minute moves out of it: see
	// TestHourOfFinishedJobsFillsTheChart); resume the queue.
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at)
		SELECT 'hooks', 'http_callback', status, finished_at FROM (`+hourOfFinishedJobs("now()")+`) s`)
	br.do(t, "the overview with the chart", chromedp.Navigate(b.url), chromedp.WaitVisible("#queues"))
	require.Equal(t, "true", br.eval(t, `String(document.querySelectorAll('#queues tr[data-queue="hooks"] td.chart rect.done').length >= 58)`))
	br.do(t, "resume mail", chromedp.Click(`#queues tr[data-queue="mail"] button[value="resume"]`), chromedp.WaitVisible(".flash"))
	require.Contains(t, br.eval(t, `document.querySelector('.flash').textContent`), `resumed`)
	require.EqualValues(t, 0, b.queryInt(t, `SELECT count(*) FROM {schema}.queues WHERE name = 'mail' AND paused_at IS NOT NULL`))
	require.Equal(t, "0", br.eval(t, `String(document.querySelectorAll('#queues button[value="resume"]').length)`))
	br.screenshot(t, "overview")

	// The schedules and dispatch triggers; pause a schedule.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.srv.admin.Declare(ctx, admin.ScheduleSpec{Name: "nightly-report", Cron: "0 3 * * *", Kind: "email", Queue: "mail"})
	require.NoError(t, err)
	_, err = b.srv.admin.Declare(ctx, admin.ScheduleSpec{Name: "heartbeat", Every: time.Minute, Kind: "noop"})
	require.NoError(t, err)
	b.exec(t, `CREATE TABLE {schema}.orders (id bigint PRIMARY KEY, status text)`)
	_, _, err = triggers.Add(ctx, b.pool, b.schema, triggers.Spec{
		Table: pgx.Identifier{b.schema, "orders"}.Sanitize(), Events: []string{"insert", "update"}, Kind: "http_callback",
		Payload: []byte(`{"url": "https://hooks.example.com/orders?token=abc12345"}`), Queue: "hooks", When: "NEW.status = 'paid'",
	})
	require.NoError(t, err)
	// The slots and runs a worker's scheduler would have left.
	b.exec(t, `UPDATE {schema}.schedules SET last_run_at = date_trunc('day', now()) + interval '3 hours',
		next_run_at = date_trunc('day', now()) + interval '1 day 3 hours', runs = 12 WHERE name = 'nightly-report'`)
	br.do(t, "open the schedules", chromedp.Navigate(b.url+"schedules"), chromedp.WaitVisible("#schedules"))
	require.NotContains(t, br.eval(t, `document.querySelector('#triggers').textContent`), "abc12345", "the payload's secret is masked")
	br.do(t, "pause a schedule", chromedp.Click(`#schedules tr[data-name="heartbeat"] button[value="pause"]`), chromedp.WaitVisible(".flash"))
	require.Equal(t, "false", b.queryString(t, `SELECT enabled::text FROM {schema}.schedules WHERE name = 'heartbeat'`))
	br.screenshot(t, "schedules")

	// Rows full of markup show as text, and run nothing.
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at, last_error, payload, result, errors) VALUES
		($1, $1, 'dead', now(), $1, jsonb_build_object('x', $1::text), jsonb_build_object('body', $1::text),
		 jsonb_build_array(jsonb_build_object('attempt', 1, 'worker', $1::text, 'error', $1::text)))`, hostile)
	evil := b.queryInt(t, `SELECT id FROM {jobs} WHERE kind = $1`, hostile)
	br.do(t, "open the hostile job", chromedp.Navigate(fmt.Sprintf("%sjobs/%d", b.url, evil)), chromedp.WaitVisible("#attempts"))
	require.Contains(t, br.eval(t, `document.querySelector('#payload').textContent`), "<script>alert(1)</script>")
	require.Contains(t, br.eval(t, `document.querySelector('#attempts').textContent`), "<img src=x onerror=alert(2)>")
	require.Equal(t, "0", br.eval(t, `String(document.querySelectorAll('main script, main img').length)`))
	br.do(t, "list the hostile job", chromedp.Navigate(b.url+"jobs?kind="+url.QueryEscape(hostile)), chromedp.WaitVisible("#rows"))
	require.Contains(t, br.eval(t, `document.querySelector('#rows').textContent`), "<script>alert(1)</script>")
	require.Contains(t, br.eval(t, `document.querySelector('#rows').textContent`), `javascript:alert(3)\x1b[31m`, "the terminal escape shows escaped")
	require.Equal(t, "0", br.eval(t, `String(document.querySelectorAll('main script, main img').length)`))
	br.do(t, "the overview with the hostile queue", chromedp.Navigate(b.url), chromedp.WaitVisible("#queues"))
	require.Contains(t, br.eval(t, `document.querySelector('#queues').textContent`), "<img src=x onerror=alert(2)>")
	br.noIncidents(t)
}

// A queue named after a property of Object.prototype, made after the
// overview was loaded, leaves the overview live: the row shows, and the
// queues that sort after it keep following the table.
func TestBrowserQueueNamedLikeAProperty(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind) VALUES ('mail', 'email')`)
	br := newBrowser(t, "ann", operatorToken)
	cell := func(queue string) string {
		return `document.querySelector('#queues tr[data-queue="` + queue + `"] [data-f="pending"]')`
	}
	br.do(t, "open the overview", chromedp.Navigate(b.url), chromedp.WaitVisible("#queues"))
	br.waitFor(t, "live", `document.querySelector('#live.on') !== null`)
	// a writer's jobs
	b.exec(t, `INSERT INTO {jobs} (queue, kind) VALUES ('__proto__', 'x'), ('constructor', 'x'), ('hasOwnProperty', 'x')`)
	br.waitFor(t, "the new queues' rows", cell("__proto__")+` !== null && `+cell("constructor")+` !== null && `+cell("hasOwnProperty")+` !== null`)
	b.exec(t, `INSERT INTO {jobs} (queue, kind) SELECT 'mail', 'email' FROM generate_series(1, 5)`)
	br.waitFor(t, "mail follows the table", cell("mail")+`.textContent === "6"`)
	require.Equal(t, "1", br.eval(t, cell("__proto__")+`.textContent`))
	require.Equal(t, "live on", br.eval(t, `document.getElementById('live').className`))
	br.noIncidents(t)
}

// An operator's delete on a job's page asks again, on a page that names
// the job, and deletes it only on "Yes"; "No" goes back with the job kept.
func TestBrowserDeleteAsksFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	id := b.queryInt(t, `INSERT INTO {jobs} (queue, kind, status, finished_at) VALUES ('mail', 'email', 'dead', now()) RETURNING id`)
	kept := func() string {
		return b.queryString(t, `SELECT count(*)::text FROM {jobs} WHERE id = $1`, id)
	}
	br := newBrowser(t, "ann", operatorToken)
	page := fmt.Sprintf("%sjobs/%d", b.url, id)
	br.do(t, "open the job, delete", chromedp.Navigate(page), chromedp.WaitVisible("#payload"),
		chromedp.Click(`button[value="delete"]`), chromedp.WaitVisible("#confirm"))
	require.Equal(t, "Delete 1 job?", br.eval(t, `document.querySelector('#question').textContent`))
	require.Equal(t, fmt.Sprintf("Jobs %d.", id), br.eval(t, `document.querySelector('#list').textContent`))
	require.Equal(t, "1", kept(), "asked, not deleted")
	br.do(t, "no", chromedp.Click("#back"), chromedp.WaitVisible("#payload"))
	require.Equal(t, "1", kept())
	br.do(t, "delete, yes", chromedp.Click(`button[value="delete"]`), chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm"), chromedp.WaitVisible(".flash"))
	require.Equal(t, "deleted 1 job", br.eval(t, `document.querySelector('.flash').textContent`))
	require.Equal(t, "0", kept())
	br.noIncidents(t)
}

// A job held back by its key's limit says why on its page, as `jobs show`
// does: in a queue whose keys run one at a time, the pending job of a key
// with a running job shows its key and the limit it waits on; a job
// without a key shows neither. A writer's key is hostile: 256 characters
// of markup and escapes show as text, run nothing and widen no page.
func TestBrowserJobWaitsOnItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `SELECT {schema}.set_flow_limit('limited', concurrency => 1)`)
	long := hostile + strings.Repeat("k", 256-len(hostile))
	insert := func(key any, status string) int64 {
		t.Helper()
		return b.queryInt(t, `INSERT INTO {jobs} (queue, kind, flow_key, status, run_at, locked_by, locked_until)
			VALUES ('limited', 'email', $1, $2, now() - interval '1 second',
			        CASE WHEN $2 = 'running' THEN 'worker-a' END, CASE WHEN $2 = 'running' THEN now() + interval '1 minute' END)
			RETURNING id`, key, status)
	}
	insert("acme", "running")
	waiting := insert("acme", "pending")
	insert(long, "running")
	hostileWaiting := insert(long, "pending")
	plain := insert(nil, "pending")

	br := newBrowser(t, "ann", viewerToken)
	open := func(id int64) {
		t.Helper()
		br.do(t, fmt.Sprintf("open job %d", id), chromedp.Navigate(fmt.Sprintf("%sjobs/%d", b.url, id)), chromedp.WaitVisible("#payload"))
	}

	open(waiting)
	require.Equal(t, "acme", br.eval(t, `document.querySelector('#flow-key td').textContent`))
	require.Equal(t, "waiting: key acme at its concurrency limit of 1 (1 running)", br.eval(t, `document.querySelector('#waiting').textContent`))
	br.screenshot(t, "job-waiting")

	open(plain)
	require.Equal(t, "0", br.eval(t, `String(document.querySelectorAll('#flow-key, #waiting').length)`))
	require.NotContains(t, br.eval(t, `document.querySelector('main').innerText`), "flow key")

	open(hostileWaiting)
	shown := visible(long)
	require.Equal(t, shown, br.eval(t, `document.querySelector('#flow-key td').textContent`))
	require.Equal(t, "waiting: key "+shown+" at its concurrency limit of 1 (1 running)", br.eval(t, `document.querySelector('#waiting').textContent`))
	require.Equal(t, "0", br.eval(t, `String(document.querySelectorAll('main script, main img').length)`))
	require.Equal(t, "true", br.eval(t, `String(document.documentElement.scrollWidth <= document.documentElement.clientWidth)`),
		"the long key widens the page")
	br.noIncidents(t)
}

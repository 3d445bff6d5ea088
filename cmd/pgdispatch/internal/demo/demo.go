// Package demo is the tour that `pgdispatch demo` gives: a worker with the
// real http_callback, email and (when RABBITMQ_URL is set) rabbitmq
// executors, receivers for them inside the process on loopback, and jobs
// inserted with plain SQL from a connection of its own, as any application
// would insert them. It prints the SQL it runs, and a line for each attempt
// with its latency from commit and what the receiver got.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/signing"
)

// Config configures Run.
type Config struct {
	// Worker configures the worker. Run sets its Registry and Observer.
	// Pool, Schema and StatementTimeout are required.
	Worker pgdispatch.Config
	// DatabaseURL is where the demo's producer connects. Required.
	DatabaseURL string
	// PsqlURL, when set, is the URL the closing hint tells to open in psql.
	PsqlURL string
	// RabbitMQURL, when set, adds rabbitmq jobs to the tour.
	RabbitMQURL string
	// Out receives everything the demo prints. Required.
	Out io.Writer
	// Count stops the demo after this many attempts. Default: run until ctx
	// ends.
	Count int
	// Interval is the pause between the tour's inserts. Default: 500ms.
	Interval time.Duration
}

// The sender of the email jobs (SMTP_FROM).
const mailFrom = "Example Shop <shop@example.com>"

// Run runs the tour, then serves the jobs that others insert until ctx ends
// or Count attempts have run, and prints the jobs by status.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	d := &demo{
		cfg: cfg, out: &lockedWriter{w: cfg.Out}, stop: stop, got: newReceipts(),
		committed: map[int64]time.Time{}, attempts: map[attemptKey]attempt{},
		finals: map[int64]string{}, retried: map[int64]bool{}, finished: make(chan struct{}),
		events: make(chan event, 4096),
	}
	closeReceivers, err := d.startReceivers()
	if err != nil {
		return err
	}
	defer closeReceivers()
	// The first signing secret, as `pgdispatch secrets rotate` makes it.
	d.keyring = signing.NewKeyring()
	if _, err := d.rotate(ctx, 0); err != nil {
		return err
	}
	cfg.Worker.SigningKeys = d.keyring
	registry, closeExecutors, err := d.registry()
	if err != nil {
		return err
	}
	defer closeExecutors()
	d.reg = registry
	cfg.Worker.Registry, cfg.Worker.Observer = registry, d
	w, err := pgdispatch.NewWorker(cfg.Worker)
	if err != nil {
		return err
	}
	d.introduce(w.ID())

	printed := make(chan struct{})
	go func() { defer close(printed); d.print() }()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.Run(gctx) })
	g.Go(func() error { return d.tour(gctx) })
	err = g.Wait()
	d.mu.Lock()
	d.stopped = true // an abandoned executor may still return
	close(d.events)
	d.mu.Unlock()
	<-printed
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	d.summary(context.WithoutCancel(ctx))
	return err
}

// demo is one run of the tour.
type demo struct {
	cfg  Config
	out  *lockedWriter
	stop func()
	got  *receipts

	webhooks *webhookReceiver
	mail     *mailCatcher
	amqp     *amqpConsumer
	amqpErr  error
	keyring  *signing.Keyring // the worker's signing secrets
	reg      *executors.Registry

	// insertMu is held across each insert and the record of its commit, so
	// that the printer never takes a job of the tour for one inserted
	// elsewhere.
	insertMu  sync.Mutex
	committed map[int64]time.Time

	mu       sync.Mutex
	attempts map[attemptKey]attempt
	finals   map[int64]string // done or dead, by job
	retried  map[int64]bool
	finished chan struct{} // closed and replaced when a job is done or dead
	seen     int           // attempts printed
	stopped  bool          // events is closed

	events chan event
}

type attemptKey struct {
	job     int64
	attempt int
}

// attempt is what the executor wrapper saw of one attempt.
type attempt struct {
	started time.Time
	err     error
}

// event is one attempt's outcome, from the worker's Observer.
type event struct {
	job     executors.Job
	outcome claimer.Outcome
	at      time.Time
}

// startReceivers starts the webhook receiver, the mail catcher and, with
// RabbitMQURL, the queue consumer.
func (d *demo) startReceivers() (closeAll func(), err error) {
	if d.webhooks, err = startWebhookReceiver(d.got); err != nil {
		return nil, err
	}
	if d.mail, err = startMailCatcher(d.got); err != nil {
		d.webhooks.close()
		return nil, err
	}
	if d.cfg.RabbitMQURL != "" {
		d.amqp, d.amqpErr = startAMQPConsumer(d.cfg.RabbitMQURL, d.got)
	}
	return func() {
		d.webhooks.close()
		d.mail.close()
		if d.amqp != nil {
			d.amqp.close()
		}
	}, nil
}

// rotate makes a signing secret, which the receiver accepts at once, and
// rotates to it with overlap, as `pgdispatch secrets rotate --print`
// does. It returns the secret's id.
func (d *demo) rotate(ctx context.Context, overlap time.Duration) (int64, error) {
	secret := signing.Generate()
	if err := d.webhooks.accept(secret.Text()); err != nil {
		return 0, err
	}
	r, err := admin.New(d.cfg.Worker.Pool, d.cfg.Worker.Schema, d.cfg.Worker.StatementTimeout).RotateSigningSecret(ctx, secret, overlap)
	if err != nil {
		return 0, err
	}
	return r.ID, nil
}

// allowNetworks lets http_callback reach this machine, where the receiver
// listens, besides the public addresses it reaches by default.
var allowNetworks = []string{httpcallback.NetworksPublic, httpcallback.NetworksLoopback}

// registry builds the executors, each wrapped to record its attempts.
func (d *demo) registry() (*executors.Registry, func(), error) {
	reg := executors.NewRegistry()
	reg.Register(executors.KindNoop, d.wrap(executors.Noop{}))
	hook, err := httpcallback.New(httpcallback.Config{Keyring: d.keyring, AllowNetworks: allowNetworks})
	if err != nil {
		return nil, nil, err
	}
	reg.Register(httpcallback.Kind, d.wrap(hook))
	mailer, err := email.New(email.Config{Host: d.mail.Host, Port: d.mail.Port, TLS: email.TLSNone, From: mailFrom})
	if err != nil {
		return nil, nil, err
	}
	reg.Register(email.Kind, d.wrap(mailer))
	closeAll := func() {}
	if d.amqp != nil {
		rabbit, err := rabbitmq.New(rabbitmq.Config{URL: d.cfg.RabbitMQURL, Name: "pgdispatch demo"})
		if err != nil {
			return nil, nil, fmt.Errorf("invalid RABBITMQ_URL: %w", err)
		}
		reg.Register(rabbitmq.Kind, d.wrap(rabbit))
		closeAll = func() { _ = rabbit.Close() }
	}
	return reg, closeAll, nil
}

// introduce prints the receivers and the worker's settings.
func (d *demo) introduce(workerID string) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nReceivers in this process, on loopback:\n")
	fmt.Fprintf(&b, "  webhooks  %-24s checks each request's signature; %s fails every first attempt with 503\n", d.webhooks.URL, flakyPath)
	fmt.Fprintf(&b, "  mail      %-24s SMTP; refuses mail to %s with 550\n", fmt.Sprintf("%s:%d", d.mail.Host, d.mail.Port), refusedRecipient)
	switch {
	case d.amqp != nil:
		fmt.Fprintf(&b, "  rabbitmq  queue %-18s on RABBITMQ_URL's broker, which deletes it when the demo ends\n", d.amqp.Queue)
	case d.amqpErr != nil:
		fmt.Fprintf(&b, "  rabbitmq  none: %v\n", d.amqpErr)
	default:
		fmt.Fprintf(&b, "  rabbitmq  none: set RABBITMQ_URL to publish to a broker too\n")
	}
	fmt.Fprintf(&b, "\nWorker %q serves schema %q, its executors set as `pgdispatch run` would be by\n", workerID, d.cfg.Worker.Schema)
	fmt.Fprintf(&b, "  HTTP_ALLOW_NETWORKS=%s  (http_callback dials public addresses only unless told)\n", strings.Join(allowNetworks, ","))
	fmt.Fprintf(&b, "  and a signing secret made for this run with `pgdispatch secrets rotate`, not shown, given to\n"+
		"  the receiver (it signs each request per Standard Webhooks)\n")
	fmt.Fprintf(&b, "  SMTP_HOST=%s SMTP_PORT=%d SMTP_TLS=none SMTP_FROM=%q\n", d.mail.Host, d.mail.Port, mailFrom)
	if d.amqp != nil {
		fmt.Fprintf(&b, "  RABBITMQ_URL=<as set>\n")
	}
	fmt.Fprintf(&b, "\nThe demo inserts each job with the SQL shown, from a connection of its own; a line\n"+
		"follows for each attempt, with its latency from commit and what the receiver got.\n")
	d.write(b.String())
}

// wrap records when each attempt started and what it returned.
func (d *demo) wrap(e executors.Executor) executors.Executor {
	return executors.Func(func(ctx context.Context, job *executors.Job) error {
		started := time.Now()
		err := e.Execute(ctx, job)
		d.mu.Lock()
		d.attempts[attemptKey{job.ID, job.Attempt}] = attempt{started, err}
		d.mu.Unlock()
		return err
	})
}

// JobStarted implements claimer.Observer.
func (d *demo) JobStarted(*executors.Job) {}

// JobFinished implements claimer.Observer: it hands the outcome to the
// printer, and never blocks.
func (d *demo) JobFinished(job *executors.Job, outcome claimer.Outcome, _ time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	select {
	case d.events <- event{job: *job, outcome: outcome, at: time.Now()}:
	default: // the printer is far behind: this line is skipped
	}
}

// print writes a line per attempt until the worker has stopped, and stops
// the demo after Count of them.
func (d *demo) print() {
	for ev := range d.events {
		d.write(d.line(ev))
		d.mu.Lock()
		switch ev.outcome {
		case claimer.OutcomeDone, claimer.OutcomeDead:
			d.finals[ev.job.ID] = string(ev.outcome)
			close(d.finished)
			d.finished = make(chan struct{})
		case claimer.OutcomeRetry:
			d.retried[ev.job.ID] = true
		}
		d.seen++
		enough := d.cfg.Count > 0 && d.seen >= d.cfg.Count
		d.mu.Unlock()
		if enough {
			d.stop()
		}
	}
}

// line describes one attempt: the job, its latency, its outcome, and what
// the receiver got or the error.
func (d *demo) line(ev event) string {
	job := ev.job
	d.mu.Lock()
	a, ran := d.attempts[attemptKey{job.ID, job.Attempt}]
	delete(d.attempts, attemptKey{job.ID, job.Attempt})
	d.mu.Unlock()
	started := ev.at // it never ran: an unknown kind, a bad timeout
	if ran {
		started = a.started
	}
	d.insertMu.Lock()
	commit, ours := d.committed[job.ID]
	d.insertMu.Unlock()
	var latency string
	switch {
	case job.RunAt.After(job.CreatedAt): // scheduled, or a retry
		latency = "started " + ms(started.Sub(job.RunAt)) + " after its run_at"
	case ours && started.Before(commit):
		// The producer heard of the commit after the worker did.
		latency = "started as its commit returned"
	case ours:
		latency = "started " + ms(started.Sub(commit)) + " after commit"
	default:
		latency = "started " + ms(started.Sub(job.CreatedAt)) + " after its insert began"
	}
	outcome := string(ev.outcome)
	if ev.outcome == claimer.OutcomeReleased {
		outcome = "given back at shutdown"
	}
	s := fmt.Sprintf("job %-4d %-13s attempt %d  %-40s %s\n", job.ID, oneLine(job.Kind, 40), job.Attempt, latency, outcome)
	wait := time.Duration(0)
	if job.Kind == rabbitmq.Kind && outcome == "done" {
		wait = 2 * time.Second // the broker confirmed; the consumer's copy may still be on its way
	}
	if text, ok := d.got.get(job.ID, job.Attempt, wait); ok {
		s += "         receiver: " + oneLine(text, 200) + "\n"
	} else if a.err != nil {
		s += "         error: " + oneLine(a.err.Error(), 200) + "\n"
	} else if !ran && outcome == "dead" {
		s += "         error: " + d.neverRan(job) + "\n"
	}
	return s
}

// neverRan says why the worker gave up on a job without running it.
func (d *demo) neverRan(job executors.Job) string {
	if _, ok := d.reg.Lookup(job.Kind); !ok {
		return fmt.Sprintf("no executor is registered for kind %q (this worker has %s)", oneLine(job.Kind, 40), strings.Join(d.reg.Kinds(), ", "))
	}
	return "the payload's timeout is invalid or above MAX_JOB_TIMEOUT"
}

// ms formats a latency in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000)
}

func (d *demo) write(s string) {
	if _, err := io.WriteString(d.out, s); err != nil {
		d.stop() // the reader of the output has gone
	}
}

// lockedWriter keeps each write whole when the tour and the printer write
// at once.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// summary prints the attempts and the jobs by status.
func (d *demo) summary(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Worker.StatementTimeout)
	defer cancel()
	rows, err := d.cfg.Worker.Pool.Query(ctx, "SELECT status, count(*) FROM "+pgx.Identifier{d.cfg.Worker.Schema, "jobs"}.Sanitize()+" GROUP BY 1 ORDER BY 1")
	if err != nil {
		return
	}
	type row struct {
		Status string
		Count  int64
	}
	counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return
	}
	d.mu.Lock()
	seen := d.seen
	d.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d dispatches. Jobs by status:", seen)
	for _, r := range counts {
		fmt.Fprintf(&b, " %s=%d", r.Status, r.Count)
	}
	b.WriteString("\n")
	d.write(b.String())
}

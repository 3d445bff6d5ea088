package main

import (
	"net/url"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// Every subcommand, with the arguments it needs to get as far as
// connecting.
var everyCommand = []struct{ words, args []string }{
	{[]string{"run"}, nil},
	{[]string{"migrate"}, nil},
	{[]string{"enqueue"}, []string{"--kind", "noop"}},
	{[]string{"demo"}, []string{"--count", "1"}},
	{[]string{"bench"}, []string{"--jobs", "1"}},
	{[]string{"triggers", "add"}, []string{"--table", "t", "--kind", "noop"}},
	{[]string{"triggers", "list"}, nil},
	{[]string{"triggers", "remove"}, []string{"t_noop"}},
	{[]string{"stats"}, nil},
	{[]string{"jobs", "list"}, nil},
	{[]string{"jobs", "show"}, []string{"1"}},
	{[]string{"jobs", "retry"}, []string{"1"}},
	{[]string{"jobs", "cancel"}, []string{"1"}},
	{[]string{"secrets", "list"}, nil},
	{[]string{"secrets", "rotate"}, []string{"--print"}},
}

// Passwords with the characters that confuse URL parsers, and so redaction:
// '@', '/' and '%'. Each piece between them is a leak of its own. A parser
// may take a piece for a host name: each holds a '!', so that no such name
// is ever looked up (Go's resolver refuses it before any query), and the
// tests send nothing off this machine.
const (
	dbPassword      = "Dbp!1@Dbp!2/Dbp!3%Dbp!4"
	listenPassword  = "Lsp!1@Lsp!2/Lsp!3%Lsp!4"
	rabbitPassword  = "Rbp!1@Rbp!2/Rbp!3%Rbp!4"
	smtpPassword    = "Smp!1@Smp!2/Smp!3%Smp!4"
	dbEnvPassword   = "Dbe!1@Dbe!2/Dbe!3%Dbe!4"
	flagPassword    = "Flp!1@Flp!2/Flp!3%Flp!4"
	signingSecret   = "whsec_Hsqftfv7Hsqftvv7Hsqft/v/" // base64, as the executor wants it
	unreachable     = "127.0.0.1:1"                    // nothing listens on port 1
	missingDatabase = "pgdispatch_no_such_database"
)

var allSecrets = []string{dbPassword, listenPassword, rabbitPassword, smtpPassword, dbEnvPassword, flagPassword, signingSecret}

// requireNoSecret fails when out holds any secret, in any encoding, or any
// fragment of one between the characters a parser may split it at.
func requireNoSecret(t *testing.T, what, out string) {
	t.Helper()
	var leaks []string
	for _, s := range allSecrets {
		forms := []string{s, url.QueryEscape(s), url.PathEscape(s), url.UserPassword("u", s).String()[2:]}
		for _, f := range strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune("@/%+=_", r) }) {
			if len(f) >= 4 && f != "whsec" {
				forms = append(forms, f)
			}
		}
		for _, f := range forms {
			if strings.Contains(out, f) {
				leaks = append(leaks, f)
			}
		}
	}
	if len(leaks) > 0 {
		t.Errorf("%s printed %q:\n%s", what, leaks, out)
	}
}

// secretEnv sets every secret setting, with databaseURL as DATABASE_URL.
func secretEnv(databaseURL string, extra ...string) []string {
	return validSecretEnv(databaseURL, append([]string{
		"LISTEN_DATABASE_URL=postgres://nobody:" + listenPassword + "@" + unreachable + "/none",
		"RABBITMQ_URL=amqp://nobody:" + rabbitPassword + "@" + unreachable + "/",
	}, extra...)...)
}

// validSecretEnv sets the secrets that are valid settings.
func validSecretEnv(databaseURL string, extra ...string) []string {
	return env(append([]string{
		"DATABASE_URL=" + databaseURL,
		"SMTP_HOST=127.0.0.1", "SMTP_USERNAME=nobody", "SMTP_PASSWORD=" + smtpPassword, "SMTP_FROM=pgdispatch@example.test",
		"HTTP_SIGNING_SECRET=" + signingSecret,
		"DB_PASSWORD=" + dbEnvPassword,
		"LOG_FORMAT=console", "LOG_LEVEL=debug",
	}, extra...)...)
}

// No secret reaches stdout, stderr or the logs: not in --help, not after a
// mistyped flag, not when a URL does not parse, does not connect, or
// connects to a server that refuses it.
func TestNoSecretIsPrinted(t *testing.T) {
	t.Parallel()
	encoded := url.UserPassword("postgres", dbPassword).String()
	databaseURLs := map[string]string{
		"unparsable":        "postgres://nobody:" + dbPassword + "@" + unreachable + "/none",
		"@ only":            "postgres://nobody:Dbp!1@Dbp!2@" + unreachable + "/none",
		"/ only":            "postgres://nobody:Dbp!1/Dbp!2@" + unreachable + "/none",
		"% only":            "postgres://nobody:Dbp!1%Dbp!2@" + unreachable + "/none",
		"unreachable":       "postgres://" + encoded + "@" + unreachable + "/none",
		"refused by server": "postgres://" + encoded + "@127.0.0.1:5432/" + missingDatabase,
		"key=value":         "host=127.0.0.1 port=1 user=nobody password='" + dbPassword + "' dbname=none",
		"query":             "postgres://nobody@" + unreachable + "/none?password=" + url.QueryEscape(dbPassword),
	}
	type run struct {
		name    string
		environ []string
		args    []string
	}
	var runs []run
	for _, cmd := range everyCommand {
		name := strings.Join(cmd.words, " ")
		with := func(flags ...string) []string { return slices.Concat(cmd.words, flags, cmd.args) }
		runs = append(runs,
			run{name + " --help", secretEnv(databaseURLs["unparsable"]), with("--help")},
			run{name + " --no-such-flag", secretEnv(databaseURLs["unparsable"]), with("--no-such-flag")},
			run{name + " --database-url", secretEnv(""), with("--database-url", "postgres://nobody:"+flagPassword+"@"+unreachable+"/none")},
			run{name + " DB_PASSWORD", append(secretEnv(""), "DB_HOST=127.0.0.1", "DB_PORT=1", "DB_USER=nobody"), with()},
		)
		for kind, u := range databaseURLs {
			runs = append(runs, run{name + " " + kind, secretEnv(u), with()})
		}
	}
	// The runs go eight at a time: each spends most of its time starting
	// (the race detector's runtime) and waiting for a refused connection.
	for batch := range slices.Chunk(runs, 8) {
		procs := make([]*proc, len(batch))
		for i, r := range batch {
			procs[i] = start(t, r.environ, r.args...)
		}
		for i, r := range batch {
			p := procs[i]
			code := p.wait(t, 2*time.Minute)
			if strings.HasSuffix(r.name, "--help") {
				require.Equal(t, 0, code, "%s: %s", r.name, p.stderr.String())
				require.Contains(t, p.stderr.String(), "Usage: pgdispatch", r.name)
			} else {
				require.NotEqual(t, 0, code, "%s: %s", r.name, p.stderr.String())
			}
			requireNoSecret(t, r.name, p.stdout.String()+p.stderr.String())
		}
	}
}

// run with a database it can use: an unparsable RABBITMQ_URL or
// LISTEN_DATABASE_URL is an error that does not echo it, and a listener
// that cannot connect logs why without the password.
func TestRunPrintsNoSecret(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	db := pgtest.URL()
	for setting, c := range map[string]struct{ env, says string }{
		"RABBITMQ_URL":        {"amqp://nobody:" + rabbitPassword + "@" + unreachable + "/", "invalid RABBITMQ_URL"},
		"LISTEN_DATABASE_URL": {"postgres://nobody:" + listenPassword + "@" + unreachable + "/none", "invalid LISTEN_DATABASE_URL"},
		"HTTP_SIGNING_SECRET": {signingSecret + "%", "the signing secret must be base64"},
	} {
		p := start(t, validSecretEnv(db, "DB_SCHEMA="+schema, setting+"="+c.env), "run")
		require.Equal(t, 1, p.wait(t, time.Minute), "%s: %s", setting, p.stderr.String())
		require.Contains(t, p.stderr.String(), c.says)
		requireNoSecret(t, "run with a bad "+setting, p.stdout.String()+p.stderr.String())
	}

	// A listener URL that parses, with a host made of the password's tail.
	p := start(t, validSecretEnv(db, "DB_SCHEMA="+schema, "LISTEN_DATABASE_URL=postgres://nobody:Lsp!1@Lsp!2@"+unreachable+"/none",
		"RABBITMQ_URL=amqp://nobody:"+url.PathEscape(rabbitPassword)+"@"+unreachable+"/"), "run")
	p.stderr.waitFor(t, "listener connection lost", time.Minute)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
	requireNoSecret(t, "run's log", p.stdout.String()+p.stderr.String())
}

// A key=value DATABASE_URL whose password holds escaped characters
// (password=a\ b): a parse error names the setting and the reason, and no
// piece of the password, before or after the escape.
func TestEscapedPasswordIsNotPrinted(t *testing.T) {
	t.Parallel()
	const pieces = `Esp!1|Esp!2|Esp!3|Esp!4`
	for name, password := range map[string]string{
		"escaped space":     `Esp!1\ Esp!2\ Esp!3`,
		"escaped quote":     `Esp!1\'Esp!2`,
		"escaped backslash": `Esp!1\\ Esp!2`,
		"quoted, escaped":   `'Esp!1\' Esp!2\\ Esp!3'`,
	} {
		for _, broken := range []string{"port=notaport", "sslmode=bogus"} {
			u := "host=127.0.0.1 user=nobody password=" + password + " dbname=none " + broken
			p := start(t, env("DATABASE_URL="+u), "stats")
			require.Equal(t, 1, p.wait(t, time.Minute), "%s: %s", name, p.stderr.String())
			out := p.stdout.String() + p.stderr.String()
			require.Contains(t, out, "invalid DATABASE_URL", name)
			for _, piece := range strings.Split(pieces, "|") {
				require.NotContains(t, out, piece, "%s, %s: the password's piece %s is printed", name, broken, piece)
			}
		}
	}
}

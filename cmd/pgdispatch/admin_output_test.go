package main

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// A row as a hostile writer leaves it: terminal escapes in every text
// column a writer sets, and a receiver's body with more in last_error.
const (
	hostileKind     = "evil\x1b[31mkind\x07"
	hostileQueue    = "q\x1b]0;pwned\x07\r"
	hostileDedupKey = "k\x1b[2J"
	hostileError    = "HTTP 500: \x1b[2J\x1b[H\r\x07fake prompt$ \xc2\x9b31m"
	hostilePayload  = `{"body": "esc \u001b[31m bel \u0007 cr \r del \u007f c1 \u009b rlo \u202e end"}`
)

// controls are the bytes no human output may carry raw: ESC, BEL, CR, DEL,
// and the C1 CSI in UTF-8.
var controls = []string{"\x1b", "\x07", "\r", "\x7f", "\xc2\x9b", "\u202e"}

func requireNoControls(t *testing.T, what, out string) {
	t.Helper()
	for _, c := range controls {
		require.NotContains(t, out, c, "%s prints %q raw:\n%s", what, c, strconv.Quote(out))
	}
}

type adminOutput struct {
	schema string
	env    []string
	id     int64
}

func (a *adminOutput) run(t *testing.T, args ...string) string {
	t.Helper()
	p := start(t, a.env, args...)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "%v: %s", args, p.stderr.String())
	return p.stdout.String()
}

func hostileRow(t *testing.T, payload, lastError string) *adminOutput {
	t.Helper()
	schema := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `INSERT INTO `+pgx.Identifier{schema, "jobs"}.Sanitize()+`
		(kind, queue, dedup_key, status, attempts, max_attempts, last_error, finished_at, payload)
		VALUES ($1, $2, $3, 'dead', 1, 1, $4, now(), $5) RETURNING id`,
		hostileKind, hostileQueue, hostileDedupKey, lastError, payload).Scan(&id))
	return &adminOutput{schema: schema, env: dbEnv(schema), id: id}
}

// jobs show, jobs list, stats and triggers list escape the control
// characters of the rows they print; --json prints them exactly.
func TestAdminOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	a := hostileRow(t, hostilePayload, hostileError)
	id := strconv.FormatInt(a.id, 10)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table := pgx.Identifier{a.schema, "orders"}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE TABLE "+table+" (id int, status text)")
	require.NoError(t, err)
	_, _, err = triggers.Add(ctx, pgtest.Pool(t), a.schema, triggers.Spec{
		Table: table, Kind: hostileKind, Queue: hostileQueue, Name: "t\x1b[8m",
		When: "NEW.status = '\x1b[31m'", Payload: json.RawMessage(hostilePayload),
	})
	require.NoError(t, err)

	show := a.run(t, "jobs", "show", id)
	requireNoControls(t, "jobs show", show)
	require.Contains(t, show, `evil\x1b[31mkind\a`)
	require.Contains(t, show, `q\x1b]0;pwned\a\r`)
	require.Contains(t, show, `HTTP 500: \x1b[2J\x1b[H\r\afake prompt$ \u009b31m`)
	require.Contains(t, show, `k\x1b[2J`)
	require.Contains(t, show, `\u009b`)
	requireNoControls(t, "jobs list", a.run(t, "jobs", "list"))
	requireNoControls(t, "stats", a.run(t, "stats"))
	list := a.run(t, "triggers", "list")
	requireNoControls(t, "triggers list", list)
	require.Contains(t, list, `t\x1b[8m`)

	// --json is exact.
	var j struct {
		Kind, Queue string
		DedupKey    string          `json:"dedup_key"`
		LastError   string          `json:"last_error"`
		Payload     json.RawMessage `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.run(t, "jobs", "show", "--json", id)), &j))
	require.Equal(t, []string{hostileKind, hostileQueue, hostileDedupKey, hostileError},
		[]string{j.Kind, j.Queue, j.DedupKey, j.LastError})
	require.JSONEq(t, hostilePayload, string(j.Payload))
	var stats []struct{ Queue, Kind string }
	require.NoError(t, json.Unmarshal([]byte(a.run(t, "stats", "--json")), &stats))
	require.Equal(t, []string{hostileQueue, hostileKind}, []string{stats[0].Queue, stats[0].Kind})
	var trigs []struct{ Name, Kind, Queue, When string }
	require.NoError(t, json.Unmarshal([]byte(a.run(t, "triggers", "list", "--json")), &trigs))
	require.Equal(t, []string{"t\x1b[8m", hostileKind, hostileQueue, "NEW.status = '\x1b[31m'"},
		[]string{trigs[0].Name, trigs[0].Kind, trigs[0].Queue, trigs[0].When})
}

// jobs show masks the secrets a payload and last_error carry: URL user
// info, query values, and the values of keys such as Authorization and
// X-Api-Key; --reveal shows them. --json masks the same unless --reveal.
func TestJobsShowMasksSecrets(t *testing.T) {
	t.Parallel()
	payload := `{"url": "https://bob:s3cretpw@example.test/hook?api_key=qk3yvalue&page=2",
		"headers": {"Authorization": "Bearer authz-s3cret", "X-Api-Key": "xapi-s3cret", "Accept": "text/plain"},
		"data": {"user": {"password_hash": "pwh4sh", "name": "ann"}, "refresh_token": 12345678, "note": "see https://ann:n0tepw@notes.test/"}}`
	// A receiver's reply that echoes the request, stored before replies were
	// masked as they are written: the payload's own secrets in it, and one
	// in base64 (AUTH PLAIN's "\x00bob\x00s3cretpw").
	lastError := "POST https://api.example.test/hook: HTTP 401: token tok3nvalue rejected at https://carl:l4sterr@other.test/?sig=s1gvalue" +
		" (echo: Authorization Bearer authz-s3cret, X-Api-Key xapi-s3cret, AUTH PLAIN AGJvYgBzM2NyZXRwdw==)"
	a := hostileRow(t, payload, lastError)
	id := strconv.FormatInt(a.id, 10)
	secrets := []string{"s3cretpw", "qk3yvalue", "authz-s3cret", "xapi-s3cret", "pwh4sh", "n0tepw", "l4sterr", "s1gvalue", "AGJvYgBzM2NyZXRwdw", "tok3nvalue"}
	kept := []string{"bob", "example.test/hook", "api_key=", "text/plain", "ann", "rejected at"}

	for _, args := range [][]string{{"jobs", "show", id}, {"jobs", "show", "--json", id}, {"jobs", "list"}, {"jobs", "list", "--json"}} {
		out := a.run(t, args...)
		for _, s := range secrets {
			require.NotContains(t, out, s, "%v prints a secret", args)
		}
		if args[1] == "show" || slices.Contains(args, "--json") { // the human list cuts last_error short
			require.Contains(t, out, "xxxxx", "%v", args)
		}
	}
	show := a.run(t, "jobs", "show", id)
	for _, s := range kept {
		require.Contains(t, show, s)
	}

	revealed := a.run(t, "jobs", "show", "--reveal", id)
	for _, s := range secrets {
		require.Contains(t, revealed, s)
	}
	var j struct {
		LastError string          `json:"last_error"`
		Payload   json.RawMessage `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.run(t, "jobs", "show", "--json", "--reveal", id)), &j))
	require.Equal(t, lastError, j.LastError)
	require.JSONEq(t, payload, string(j.Payload))
	require.Contains(t, a.run(t, "jobs", "list", "--json", "--reveal"), "l4sterr")

	var masked struct {
		Payload struct {
			Data struct {
				RefreshToken any `json:"refresh_token"`
			} `json:"data"`
		} `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.run(t, "jobs", "show", "--json", id)), &masked))
	require.Equal(t, "xxxxx", masked.Payload.Data.RefreshToken, "a number under a secret key is masked too")
}

// jobs show prints each failed attempt and the result, escaped and masked
// as the rest of the row; --json holds both.
func TestJobsShowPrintsTheAttempts(t *testing.T) {
	t.Parallel()
	a := hostileRow(t, `{}`, "HTTP 503")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pgtest.Pool(t).Exec(ctx, `UPDATE `+pgx.Identifier{a.schema, "jobs"}.Sanitize()+` SET
		errors = jsonb_build_array(
		    jsonb_build_object('attempt', 1, 'started_at', '2026-11-27T07:00:00Z', 'finished_at', '2026-11-27T07:00:00.25Z',
		                       'worker', 'w1', 'error', 'HTTP 500 from https://bob:hunter2@example.com/hook',
		                       'result', jsonb_build_object('status', 500, 'body', $2::text)),
		    'not an entry'),
		result = jsonb_build_object('status', 200, 'token', 'sekrit')
		WHERE id = $1`, a.id, hostileError)
	require.NoError(t, err)
	id := strconv.FormatInt(a.id, 10)

	show := a.run(t, "jobs", "show", id)
	requireNoControls(t, "jobs show", show)
	for _, want := range []string{
		"attempt 1", "took 250ms", "on w1", "HTTP 500 from https://bob:xxxxx@example.com/hook",
		`"status":500`, "(1 entries not in the worker's form", `"status":200`, `"token":"xxxxx"`,
	} {
		require.Contains(t, show, want)
	}
	require.NotContains(t, show, "hunter2")
	require.NotContains(t, show, "sekrit")

	var j struct {
		Errors []json.RawMessage `json:"errors"`
		Result map[string]any    `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.run(t, "jobs", "show", "--json", id)), &j))
	require.Len(t, j.Errors, 2)
	require.Equal(t, "xxxxx", j.Result["token"])
	require.Contains(t, a.run(t, "jobs", "show", "--reveal", id), "sekrit")
}

// queues pause, list and resume, and jobs snooze and cancel, as an
// operator runs them.
func TestQueueAndJobControls(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `INSERT INTO `+pgx.Identifier{schema, "jobs"}.Sanitize()+
		` (kind, queue) VALUES ('noop', 'mail') RETURNING id`).Scan(&id))
	jobID := strconv.FormatInt(id, 10)

	require.Equal(t, "queue mail: paused\n", a.run(t, "queues", "pause", "mail"))
	code, out, _ := a.runExit(t, "queues", "pause", "mail") // a command that did nothing exits non-zero
	require.Equal(t, 1, code)
	require.Equal(t, "queue mail: already paused\n", out)
	list := a.run(t, "queues", "list")
	require.Regexp(t, `(?m)^mail\s+paused\s+\S+\s+1\s+0$`, list)
	require.Contains(t, a.run(t, "stats"), "mail (paused)")
	require.Equal(t, "queue mail: resumed\n", a.run(t, "queues", "resume", "mail"))
	code, out, _ = a.runExit(t, "queues", "resume", "mail")
	require.Equal(t, 1, code)
	require.Equal(t, "queue mail: not paused\n", out)
	require.Regexp(t, `(?m)^mail\s+active\s+-\s+1\s+0$`, a.run(t, "queues", "list"))

	require.Equal(t, "job "+jobID+": snoozed for 1h0m0s (was pending)\n", a.run(t, "jobs", "snooze", "--for", "1h", jobID))
	var in float64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT extract(epoch FROM run_at - now()) FROM `+
		pgx.Identifier{schema, "jobs"}.Sanitize()+` WHERE id = $1`, id).Scan(&in))
	require.InDelta(t, 3600, in, 10)
	require.Equal(t, "job "+jobID+": cancelled (was pending)\n", a.run(t, "jobs", "cancel", jobID))
	code, out, _ = a.runExit(t, "jobs", "snooze", "--for", "1h", jobID)
	require.Equal(t, 1, code)
	require.Equal(t, "job "+jobID+": left as it is: cancelled, not pending\n", out)

	p := start(t, a.env, "jobs", "snooze", jobID)
	require.Equal(t, 2, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "give --for with a positive duration")
}

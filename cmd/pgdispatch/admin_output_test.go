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

	"github.com/pgdispatch/pgdispatch/internal/pgtest"
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
	lastError := "POST https://api.example.test/hook: HTTP 401: token tok3nvalue rejected at https://carl:l4sterr@other.test/?sig=s1gvalue"
	a := hostileRow(t, payload, lastError)
	id := strconv.FormatInt(a.id, 10)
	secrets := []string{"s3cretpw", "qk3yvalue", "authz-s3cret", "xapi-s3cret", "pwh4sh", "n0tepw", "l4sterr", "s1gvalue"}
	kept := []string{"bob", "example.test/hook", "api_key=", "text/plain", "ann", "tok3nvalue"}

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

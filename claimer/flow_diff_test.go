package claimer

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// flowFn renders the claim_flow of a migration file as name.
func flowFn(t *testing.T, path, name, schema string) string {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := string(b)
	i := strings.Index(s, "CREATE OR REPLACE FUNCTION {{.schema}}.claim_flow(")
	require.GreaterOrEqual(t, i, 0, "no claim_flow in %s", path)
	s = s[i:]
	j := strings.Index(s, "\n$$;\n")
	s = s[:j+5]
	s = strings.Replace(s, "{{.schema}}.claim_flow(", "{{.schema}}."+name+"(", 1)
	s = strings.ReplaceAll(s, "{{.schema}}", pgx.Identifier{schema}.Sanitize())
	s = strings.ReplaceAll(s, "{{.schema_literal}}", "'"+schema+"'")
	return s
}

type flowOut struct {
	ids      string
	nextIn   *float64
	stranded *bool
	held     *bool
	cursor   *string
	unkeyed  *bool
}

func (o flowOut) String() string {
	f := func(p any) string {
		switch v := p.(type) {
		case *float64:
			if v == nil {
				return "nil"
			}
			return strconv.FormatFloat(*v, 'f', 1, 64)
		case *bool:
			if v == nil {
				return "nil"
			}
			return strconv.FormatBool(*v)
		case *string:
			if v == nil {
				return "nil"
			}
			return strconv.Quote(*v)
		}
		return "?"
	}
	return fmt.Sprintf("ids=%s next_in=%s stranded=%s held=%s cursor=%s unkeyed=%s", o.ids, f(o.nextIn), f(o.stranded), f(o.held), f(o.cursor), f(o.unkeyed))
}

func sameOut(a, b flowOut, ignoreUnkeyedNull bool) bool {
	eqB := func(x, y *bool) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	if a.ids != b.ids || !eqB(a.stranded, b.stranded) || !eqB(a.held, b.held) {
		return false
	}
	if (a.cursor == nil) != (b.cursor == nil) || (a.cursor != nil && *a.cursor != *b.cursor) {
		return false
	}
	if (a.nextIn == nil) != (b.nextIn == nil) || (a.nextIn != nil && (*a.nextIn-*b.nextIn > 0.2 || *b.nextIn-*a.nextIn > 0.2)) {
		return false
	}
	if ignoreUnkeyedNull && (a.unkeyed == nil || b.unkeyed == nil) {
		return true
	}
	return eqB(a.unkeyed, b.unkeyed)
}

// With every pending job due, claim_flow walks the keys migration 017's
// walked: a claim takes the same jobs, and says the same (but unkeyed:
// NULL when it found nothing due, where 017 said it looked).
func TestFlowClaimMatches017WhenAllDue(t *testing.T) {
	t.Parallel()
	diffs := flowDiff(t, 1, 150, true, true)
	for kind, n := range diffs {
		require.False(t, strings.HasPrefix(kind, "017 vs HEAD"), "%d scenarios: %s", n, kind)
	}
	require.Positive(t, diffs["cov: list, batched"])
	require.Positive(t, diffs["cov: walk"])
}

func flowDiff(t *testing.T, seed int64, n int, bias, allDue bool) map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	schema := pgtest.FreshSchema(t)
	pool := newSizedPool(ctx, t, 4)
	names := []string{"claim_flow_017", "claim_flow"}
	_, err := pool.Exec(ctx, flowFn(t, "../migrations/sql/017_claim_flow.sql", "claim_flow_017", schema))
	require.NoError(t, err)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	fn := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "aa", "a b", "B", "é", "Z9", "9", "10", "a-b", "ab", "b\u00a0"}
	diffs := map[string]int{}
	for sc := 0; sc < n; sc++ {
		rng := rand.New(rand.NewSource(seed*100000 + int64(sc)))
		queue := fmt.Sprintf("q%d_%d", seed, sc)
		nk := 1 + rng.Intn(len(keys))
		kk := keys[:nk]
		var log []string
		exec := func(sql string, args ...any) {
			log = append(log, fmt.Sprintf("%s %v", sql, args))
			_, err := pool.Exec(ctx, sql, args...)
			require.NoError(t, err, sql)
		}
		nullInt := func(p float64, max int) any {
			if rng.Float64() < p {
				return 1 + rng.Intn(max)
			}
			return nil
		}
		// the default limit, and some keys'
		mode := rng.Intn(4)
		setLim := func(key any) {
			switch mode {
			case 0:
				exec("SELECT "+fn("set_flow_limit")+"($1, $2, $3, false, NULL, NULL)", queue, key, 1+rng.Intn(2))
			case 1:
				exec("SELECT "+fn("set_flow_limit")+"($1, $2, NULL, true, NULL, NULL)", queue, key)
			case 2:
				exec("SELECT "+fn("set_flow_limit")+"($1, $2, $3, false, $4, interval '1 hour')", queue, key, nullInt(0.5, 2), 1+rng.Intn(3))
			case 3:
				exec("SELECT "+fn("set_flow_limit")+"($1, $2, $3, $4, $5, interval '1 hour')", queue, key, nullInt(0.3, 2), rng.Intn(3) == 0, 1+rng.Intn(3))
			}
		}
		if rng.Intn(3) > 0 {
			setLim(nil)
		}
		for _, k := range kk {
			if rng.Intn(4) == 0 {
				mode = rng.Intn(4)
				setLim(k)
			}
		}
		if rng.Intn(3) == 0 || true {
			// at least one limit
			mode = rng.Intn(4)
			setLim(kk[rng.Intn(len(kk))])
		}
		nj := rng.Intn(30)
		dueP := rng.Float64()
		if bias {
			nj, dueP = 10+rng.Intn(12), 0.85+0.15*rng.Float64()
		}
		for i := 0; i < nj; i++ {
			var key any
			if rng.Intn(4) > 0 || (bias && rng.Intn(5) > 0) {
				key = kk[rng.Intn(len(kk))]
			}
			off := -(1 + rng.Intn(600))
			if rng.Float64() > dueP && !allDue {
				off = 60 + rng.Intn(3600)
			}
			status := "pending"
			if rng.Intn(7) == 0 {
				status = "running"
			}
			exec("INSERT INTO "+jobs+" (queue, kind, flow_key, priority, run_at) VALUES ($1, 'noop', $2, $3, now() + $4 * interval '1 second')",
				queue, key, rng.Intn(3), off)
			if status == "running" {
				exec("UPDATE " + jobs + " SET status = 'running', attempts = 1, locked_by = 'x', locked_until = now() + interval '1 hour' WHERE id = (SELECT max(id) FROM " + jobs + ")")
			}
		}
		// flow_keys: heads and starts
		for _, k := range kk {
			if rng.Intn(3) == 0 {
				nstarts := rng.Intn(4)
				exec("INSERT INTO "+fn("flow_keys")+" (queue, key, head, starts) VALUES ($1, $2, (SELECT id FROM "+jobs+" WHERE queue = $1 AND flow_key = $2 ORDER BY random() LIMIT 1), "+
					"ARRAY(SELECT now() - g * interval '7 minutes' FROM generate_series(1, $3) g ORDER BY 1)) ON CONFLICT DO NOTHING", queue, k, nstarts)
			}
		}
		// another transaction's locks
		other, err := pool.Begin(ctx)
		require.NoError(t, err)
		for _, k := range kk {
			if rng.Intn(8) == 0 {
				_, err = other.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2 || '/' || $3, 0))", schema, queue, k)
				require.NoError(t, err)
				log = append(log, "advisory "+k)
			}
		}
		if rng.Intn(3) == 0 {
			tag, err := other.Exec(ctx, "SELECT FROM "+jobs+" WHERE queue = $1 AND status = 'pending' AND random() < 0.2 FOR UPDATE", queue)
			require.NoError(t, err)
			log = append(log, fmt.Sprintf("row locks %d", tag.RowsAffected()))
		}
		limit := 1 + rng.Intn(5)
		if bias {
			limit = 1 + rng.Intn(2)
		}
		var after any
		switch rng.Intn(3) {
		case 1:
			after = kk[rng.Intn(len(kk))]
		case 2:
			after = kk[rng.Intn(len(kk))] + "x"
		}
		look := rng.Intn(3) > 0
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		outs := map[string]flowOut{}
		for _, name := range names {
			sp, err := tx.Begin(ctx)
			require.NoError(t, err)
			var o flowOut
			_, err = sp.Exec(ctx, "SELECT setseed(0.25)")
			require.NoError(t, err)
			require.NoError(t, sp.QueryRow(ctx, "SELECT coalesce(string_agg(id::text, ',' ORDER BY id), ''), (array_agg(next_in))[1], (array_agg(stranded))[1], "+
				"(array_agg(held))[1], (array_agg(cursor_key))[1], (array_agg(unkeyed))[1] FROM "+fn(name)+"($1, $2, 'w', 30, 5, 1048576, $3, $4)",
				queue, limit, after, look).Scan(&o.ids, &o.nextIn, &o.stranded, &o.held, &o.cursor, &o.unkeyed))
			require.NoError(t, sp.Rollback(ctx))
			outs[name] = o
		}
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, other.Rollback(ctx))
		var state string
		require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(string_agg(format('%s:%s:p%s:%s:%s', id, coalesce(flow_key, '-'), priority, status, CASE WHEN run_at <= now() THEN 'due' ELSE 'later' END), ' ' ORDER BY id), '') FROM "+jobs+" WHERE queue = $1", queue).Scan(&state))
		var nDue, nDueKeys int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT flow_key) FROM "+jobs+" WHERE queue = $1 AND status = 'pending' AND run_at <= now()", queue).Scan(&nDue, &nDueKeys))
		switch {
		case nDue == 0:
			diffs["cov: none due"]++
		case nDue > 16:
			diffs["cov: walk"]++
		case nDueKeys > limit+limit/2+8:
			diffs["cov: list, batched"]++
		default:
			diffs["cov: list"]++
		}
		var allDue bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT FROM "+jobs+" WHERE queue = $1 AND status = 'pending' AND run_at > now())", queue).Scan(&allDue))
		report := func(kind, a, b string) {
			diffs[kind]++
			if strings.Contains(kind, "some not due") && diffs[kind] <= 12 {
				t.Logf("%s: scenario %d limit=%d after=%v look=%v\n  %s: %s\n  %s: %s\n  jobs: %s\n  %s", kind, sc, limit, after, look, a, outs[a], b, outs[b], state, strings.Join(log[len(log)-3:], " | "))
			}
			if diffs[kind] <= 3 && !strings.Contains(kind, "NULL only") && !strings.Contains(kind, "some not due") {
				t.Logf("%s: scenario %d limit=%d after=%v look=%v\n%s\n  %s: %s\n  %s: %s\n  jobs: %s", kind, sc, limit, after, look, strings.Join(log, "\n"), a, outs[a], b, outs[b], state)
			}
		}
		if !sameOut(outs["claim_flow_017"], outs["claim_flow"], true) {
			kind := "017 vs HEAD (some not due)"
			if allDue {
				kind = "017 vs HEAD (all due)"
			}
			report(kind, "claim_flow_017", "claim_flow")
		}
	}
	return diffs
}

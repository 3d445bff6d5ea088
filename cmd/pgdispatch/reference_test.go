package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
	"github.com/pgdispatch/pgdispatch/metrics"
	"github.com/pgdispatch/pgdispatch/signing"
)

const referencePath = "../../docs/reference.md"

// settingGroups are the settings the commands read. A []settings.Setting variable
// missing here fails TestReference/settings, so that a new group cannot
// escape the check.
var settingGroups = map[string][]settings.Setting{
	"connSettings":     connSettings,
	"workerSettings":   workerSettings,
	"executorSettings": executorSettings,
	"serveSettings":    serveSettings,
	"atWorkerSettings": atWorkerSettings,
	"consoleSettings":  consoleSettings,
}

// Names the docs may use that are neither settings, flags nor metrics of
// the binary.
var (
	// Variables read by the tests, and a part of a variable name the
	// redactor matches.
	otherVariables = []string{"TEST_DATABASE_URL", "RABBITMQ_TEST_URL", "E2E_DURATION", "PGDISPATCH_TIMING", "API_KEY"}
	// Flags of other programs.
	otherFlags = []string{"help", "build", "scale", "disable-triggers"}
)

// TestReference checks docs/reference.md against the code: the settings,
// the commands' flags, the metrics, the jobs table's columns and the SQL
// functions, each in both directions, and that the reference and the
// README name no variable, flag or metric the code lacks.
func TestReference(t *testing.T) {
	t.Parallel()
	ref := readDoc(t, referencePath)
	readme := readDoc(t, "../../README.md")
	flags := commandFlags(t)

	t.Run("settings", func(t *testing.T) {
		t.Parallel()
		checkSettings(t, ref)
	})
	t.Run("command flags", func(t *testing.T) {
		t.Parallel()
		checkCommandFlags(t, ref, flags)
	})
	t.Run("schema and metrics", func(t *testing.T) {
		t.Parallel()
		names := checkSchemaAndMetrics(t, ref)
		allowed := map[string]bool{}
		for _, f := range flags {
			allowed[f.def] = true // the demo's schema
		}
		for _, doc := range []doc{ref, readme} {
			checkMentions(t, doc, `\bpgdispatch_[a-z0-9_]+`, "metric", func(m string) bool {
				if allowed[m] || names[m] {
					return true
				}
				for n := range names { // a family, such as pgdispatch_http_*
					if strings.HasSuffix(m, "_") && strings.HasPrefix(n, m) {
						return true
					}
				}
				return false
			})
		}
	})
	t.Run("mentions", func(t *testing.T) {
		t.Parallel()
		variables := map[string]bool{}
		for _, v := range append(otherVariables, tracing.Variables...) {
			variables[v] = true
		}
		envName := regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)
		for _, g := range settingGroups {
			for _, s := range g {
				variables[s.Env] = true
				for _, v := range envName.FindAllString(s.Help, -1) { // DATABASE_URL's DB_HOST and friends
					variables[v] = true
				}
			}
		}
		known := map[string]bool{}
		for _, f := range otherFlags {
			known[f] = true
		}
		for _, f := range flags {
			known[f.name] = true
		}
		for _, doc := range []doc{ref, readme} {
			checkMentions(t, doc, envName.String(), "variable", func(m string) bool { return variables[m] })
			// One-word names only when assigned, as in LEASE=1m: bare, they
			// are SQL's keywords too.
			checkMentions(t, doc, `\b[A-Z][A-Z0-9]{2,}=`, "variable", func(m string) bool { return variables[strings.TrimSuffix(m, "=")] })
			checkMentions(t, doc, `(?:^|[\s\x60(\[])--[a-z][a-z0-9-]*`, "flag", func(m string) bool {
				return known[m[strings.Index(m, "--")+2:]]
			})
		}
	})
}

type doc struct{ path, text string }

func readDoc(t *testing.T, path string) doc {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return doc{path, string(b)}
}

// table is a Markdown table: its header's cells and its rows' cells.
type table struct {
	header []string
	rows   [][]string
}

// tablesWith returns the rows of every table of doc whose header is
// header, each with a cell per column.
func (d doc) tablesWith(header ...string) [][]string {
	var rows [][]string
	for _, tb := range d.tables() {
		if slices.Equal(tb.header, header) {
			for _, row := range tb.rows {
				for len(row) < len(header) {
					row = append(row, "")
				}
				rows = append(rows, row)
			}
		}
	}
	return rows
}

func (d doc) tables() []table {
	var (
		out []table
		cur *table
	)
	lines := strings.Split(d.text, "\n")
	for i, line := range lines {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			cur = nil
			continue
		}
		switch {
		case cur == nil && i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "|---"):
			out = append(out, table{header: cells(line)})
			cur = &out[len(out)-1]
		case cur != nil && !strings.HasPrefix(line, "|---"):
			cur.rows = append(cur.rows, cells(line))
		}
	}
	return out
}

func cells(line string) []string {
	parts := strings.Split(strings.Trim(line, "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

var codeSpan = regexp.MustCompile("`([^`]*)`")

// code returns the first code span of a cell, or "" when it has none.
func code(cell string) string {
	if m := codeSpan.FindStringSubmatch(cell); m != nil {
		return m[1]
	}
	return ""
}

// problems collects what is missing or extra, and reports it all at once.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) report(t *testing.T, what string) {
	t.Helper()
	if len(p) > 0 {
		sort.Strings(p)
		t.Errorf("%s does not match the code (%s):\n  %s", referencePath, what, strings.Join(p, "\n  "))
	}
}

// update rewrites the setting tables of docs/reference.md from the code.
var update = flag.Bool("update", false, "rewrite the setting tables of docs/reference.md from the code")

// settingTable marks a setting table generated from a group of
// settingGroups, and ends it.
var settingTable = regexp.MustCompile("(?s)<!-- generated from (\\w+): go test -run TestReference -update -->\n(.*?)\n<!-- end of generated table -->")

// checkSettings: each group of settings has one table in the reference,
// generated from the code's variable, flag, default and meaning, so that
// every setting has a row and every row is a setting.
func checkSettings(t *testing.T, ref doc) {
	checkGroupsAreListed(t)
	var p problems
	seen := map[string]bool{}
	text := settingTable.ReplaceAllStringFunc(ref.text, func(block string) string {
		m := settingTable.FindStringSubmatch(block)
		g, ok := settingGroups[m[1]]
		if !ok || seen[m[1]] {
			p.addf("a table is generated from %s, which is no group of settingGroups, or has another table", m[1])
			return block
		}
		seen[m[1]] = true
		var b strings.Builder
		b.WriteString("| variable | flag | default | meaning |\n|---|---|---|---|")
		for _, s := range g {
			flag, def := "(environment only)", " "
			if s.Flag != "" {
				flag = "`--" + s.Flag + "`"
			}
			if s.Default != "" {
				def = " `" + s.Default + "` "
			}
			fmt.Fprintf(&b, "\n| `%s` | %s |%s| %s |", s.Env, flag, def, s.Help)
		}
		if m[2] != b.String() {
			p.addf("the table of %s is not the code's: run go test -run TestReference -update ./cmd/pgdispatch", m[1])
		}
		return strings.Replace(block, m[2], b.String(), 1)
	})
	for name := range settingGroups {
		if !seen[name] {
			p.addf("missing: no table is generated from %s", name)
		}
	}
	if *update && text != ref.text {
		require.NoError(t, os.WriteFile(ref.path, []byte(text), 0o644))
		return
	}
	p.report(t, "generated setting tables")
}

// checkGroupsAreListed fails when the package declares a []settings.Setting variable
// that settingGroups does not hold.
func checkGroupsAreListed(t *testing.T) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var missing []string
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.VAR {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) && isSettingSlice(vs.Values[i]) && settingGroups[name.Name] == nil {
						missing = append(missing, name.Name)
					}
				}
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("settings declared in cmd/pgdispatch that TestReference does not check: %s; add them to settingGroups",
			strings.Join(missing, ", "))
	}
}

func isSettingSlice(e ast.Expr) bool {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return false
	}
	arr, ok := lit.Type.(*ast.ArrayType)
	if !ok {
		return false
	}
	sel, ok := arr.Elt.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "settings" && sel.Sel.Name == "Setting"
}

// cmdFlag is a flag of one command, as its --help prints it.
type cmdFlag struct {
	command, name, typ, def, usage string
}

var (
	commandLine = regexp.MustCompile(`(?m)^  pgdispatch ([a-z][a-z-]*)`)
	flagLine    = regexp.MustCompile(`^  -([a-z0-9-]+)(?: ([a-z]+))?$`)
	flagDefault = regexp.MustCompile(`\(default (.*)\)$`)
)

// commandFlags runs every command and subcommand with --help and reads its
// flags.
func commandFlags(t *testing.T) []cmdFlag {
	t.Helper()
	help := func(args ...string) (stdout, stderr string) {
		var out, errOut bytes.Buffer
		code := realMain(append(args, "--help"), &out, &errOut)
		require.Equal(t, 0, code, "pgdispatch %s --help: %s", strings.Join(args, " "), errOut.String())
		return out.String(), errOut.String()
	}
	top, _ := help()
	var flags []cmdFlag
	for _, m := range commandLine.FindAllStringSubmatch(top, -1) {
		cmd := m[1]
		out, errOut := help(cmd)
		if strings.Contains(errOut, "Usage: pgdispatch "+cmd+" [flags]") {
			flags = append(flags, parseFlags(cmd, errOut)...)
			continue
		}
		// A command of subcommands prints their list.
		subs := regexp.MustCompile(`(?m)^  pgdispatch `+cmd+` ([a-z]+)`).FindAllStringSubmatch(out, -1)
		require.NotEmpty(t, subs, "pgdispatch %s --help lists neither flags nor subcommands:\n%s%s", cmd, out, errOut)
		for _, s := range subs {
			_, errOut := help(cmd, s[1])
			require.Contains(t, errOut, "Usage: pgdispatch "+cmd+" "+s[1])
			flags = append(flags, parseFlags(cmd+" "+s[1], errOut)...)
		}
	}
	require.NotEmpty(t, flags)
	return flags
}

// parseFlags reads flag.PrintDefaults' output. A default equal to the
// type's zero value is not printed.
func parseFlags(cmd, help string) []cmdFlag {
	var flags []cmdFlag
	lines := strings.Split(help, "\n")
	for i, line := range lines {
		m := flagLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		f := cmdFlag{command: cmd, name: m[1], typ: cmp.Or(m[2], "bool")}
		// The usage follows, each of its lines indented with a tab; the
		// default ends the last.
		for j := i + 1; j < len(lines) && strings.HasPrefix(lines[j], "    \t"); j++ {
			f.usage += lines[j]
			if d := flagDefault.FindStringSubmatch(lines[j]); d != nil && (j+1 == len(lines) || !strings.HasPrefix(lines[j+1], "    \t")) {
				f.def = d[1]
				if s, err := strconv.Unquote(d[1]); err == nil && f.typ == "string" {
					f.def = s
				}
			}
		}
		if f.def == "" {
			f.def = map[string]string{"bool": "false", "int": "0", "duration": "0s"}[f.typ]
		}
		flags = append(flags, f)
	}
	return flags
}

// checkCommandFlags: every flag of a command that is not a setting appears
// in the commands' flag table with its default, and every row is a flag.
func checkCommandFlags(t *testing.T, ref doc, flags []cmdFlag) {
	// A setting's flag names its variable in its usage.
	settingFlags := map[string]string{}
	for _, g := range settingGroups {
		for _, s := range g {
			if s.Flag != "" {
				settingFlags[s.Flag] = "($" + s.Env + ")"
			}
		}
	}
	rows := map[[2]string][]string{}
	var p problems
	for _, row := range ref.tablesWith("command", "flag", "default", "meaning") {
		key := [2]string{code(row[0]), strings.TrimPrefix(code(row[1]), "--")}
		if _, dup := rows[key]; dup {
			p.addf("%s --%s has two rows", key[0], key[1])
		}
		rows[key] = row
	}
	seen := map[[2]string]bool{}
	for _, f := range flags {
		if env, ok := settingFlags[f.name]; ok && strings.Contains(f.usage, env) {
			continue
		}
		key := [2]string{f.command, f.name}
		seen[key] = true
		row, ok := rows[key]
		if !ok {
			p.addf("missing: %s --%s has no row in the commands' flag table", f.command, f.name)
			continue
		}
		if got := code(row[2]); !sameDefault(f.typ, got, f.def) {
			p.addf("%s --%s: default is %q in the reference, %q in the code", f.command, f.name, got, f.def)
		}
	}
	for key := range rows {
		if !seen[key] {
			p.addf("extra: %s --%s is in the commands' flag table but is no flag of that command", key[0], key[1])
		}
	}
	p.report(t, "commands' flag table: | command | flag | default | meaning |")
}

func sameDefault(typ, doc, code string) bool {
	if typ == "duration" {
		a, errA := time.ParseDuration(doc)
		b, errB := time.ParseDuration(code)
		return errA == nil && errB == nil && a == b
	}
	if doc == "" && (typ == "int" || typ == "bool") {
		return false // a zero default is written out
	}
	return doc == code
}

// checkSchemaAndMetrics compares the metrics a worker's registry serves,
// the jobs table's columns and the schema's functions with the reference.
// It returns the metric names.
func checkSchemaAndMetrics(t *testing.T, ref doc) map[string]bool {
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The executors as run builds them, so that those that are collectors
	// are registered as in production.
	v := settings.New(flag.NewFlagSet("reference", flag.ContinueOnError), executorSettings)
	breaker, err := buildBreaker(v, pool, schema, 0, zap.NewNop())
	require.NoError(t, err)
	registry, closeExecutors, err := buildRegistry(v, zap.NewNop(), "reference", signing.NewKeyring(), breaker)
	require.NoError(t, err)
	defer closeExecutors()
	m := metrics.New(pool, registry)
	w, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pool, Schema: schema, WorkerID: "reference", Registry: registry, Observer: m})
	require.NoError(t, err)
	m.Attach(w)
	// A job in the table and one observed, so that every family has a series.
	_, err = pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+" (kind) VALUES ('noop')")
	require.NoError(t, err)
	// And a schedule that has run.
	_, err = pool.Exec(ctx, "SELECT "+pgx.Identifier{schema, "schedule"}.Sanitize()+"('reference', '@daily', 'noop')")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "schedules"}.Sanitize()+
		" SET next_run_at = now() + interval '1 day', last_run_at = now()")
	require.NoError(t, err)
	job := &executors.Job{ID: 1, Queue: pgdispatch.DefaultQueue, Kind: "noop", Attempt: 1, RunAt: time.Now()}
	m.JobStarted(job)
	m.JobFinished(job, "done", time.Millisecond)
	w.Sweeper().LookAtHorizon(ctx)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	text := expfmt.NewTextParser(model.UTF8Validation)
	families, err := text.TextToMetricFamilies(rec.Body)
	require.NoError(t, err)

	names := map[string]bool{}
	var p problems
	rows := map[string][]string{}
	for _, row := range ref.tablesWith("metric", "type", "labels") {
		name := code(row[0])
		if _, dup := rows[name]; dup {
			p.addf("%s has two rows", name)
		}
		rows[name] = row
	}
	for name, f := range families {
		if !strings.HasPrefix(name, "pgdispatch_") { // the Go runtime's and the process's
			continue
		}
		names[name] = true
		row, ok := rows[name]
		if !ok {
			p.addf("missing: metric %s has no row in the metrics table", name)
			continue
		}
		if want, got := strings.ToLower(f.GetType().String()), firstWord(row[1]); got != want {
			p.addf("%s: type is %s in the reference, %s in the code", name, got, want)
		}
		if want, got := labelNames(f), docLabels(row[2]); !slices.Equal(got, want) {
			p.addf("%s: labels are %v in the reference, %v in the code", name, got, want)
		}
	}
	for name := range rows {
		if !names[name] {
			p.addf("extra: metric %s is in the metrics table but the worker does not serve it", name)
		}
	}
	p.report(t, "metrics table: | metric | type | labels |")

	p = nil
	var columns []string
	rowsCols, err := pool.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'jobs' ORDER BY ordinal_position`, schema)
	require.NoError(t, err)
	columns, err = pgx.CollectRows(rowsCols, pgx.RowTo[string])
	require.NoError(t, err)
	compareNames(&p, "column", columns, ref.tablesWith("column", "type", "meaning"), func(cell string) string { return code(cell) })
	p.report(t, "jobs table: | column | type | meaning |")

	// The schedules table's rows may name several columns: `kind`, `payload`.
	p = nil
	rowsCols, err = pool.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'schedules' ORDER BY ordinal_position`, schema)
	require.NoError(t, err)
	columns, err = pgx.CollectRows(rowsCols, pgx.RowTo[string])
	require.NoError(t, err)
	var scheduleRows [][]string
	for _, row := range ref.tablesWith("schedule column", "type", "meaning") {
		for _, m := range codeSpan.FindAllStringSubmatch(row[0], -1) {
			scheduleRows = append(scheduleRows, []string{"`" + m[1] + "`"})
		}
	}
	compareNames(&p, "column", columns, scheduleRows, func(cell string) string { return code(cell) })
	p.report(t, "schedules table: | schedule column | type | meaning |")

	p = nil
	rowsFns, err := pool.Query(ctx, `SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.prorettype <> 'trigger'::regtype ORDER BY 1`, schema)
	require.NoError(t, err)
	functions, err := pgx.CollectRows(rowsFns, pgx.RowTo[string])
	require.NoError(t, err)
	compareNames(&p, "function", functions, ref.tablesWith("function", "returns", "meaning"), func(cell string) string {
		name, _, _ := strings.Cut(code(cell), "(")
		return name
	})
	p.report(t, "SQL functions: | function | returns | meaning |")
	return names
}

func labelNames(f *dto.MetricFamily) []string {
	set := map[string]bool{}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			set[l.GetName()] = true
		}
	}
	out := make([]string, 0, len(set))
	for l := range set {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

func firstWord(cell string) string {
	w, _, _ := strings.Cut(strings.TrimSpace(cell), " ")
	return strings.TrimRight(w, ",;")
}

var parenthesis = regexp.MustCompile(`\([^)]*\)`)

// docLabels reads a labels cell such as "queue, kind, outcome (`done`, …)".
func docLabels(cell string) []string {
	out := []string{}
	for _, l := range strings.Split(parenthesis.ReplaceAllString(cell, ""), ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

func compareNames(p *problems, what string, inCode []string, rows [][]string, name func(string) string) {
	inDoc := map[string]bool{}
	for _, row := range rows {
		inDoc[name(row[0])] = true
	}
	for _, n := range inCode {
		if !inDoc[n] {
			p.addf("missing: %s %s has no row", what, n)
		}
	}
	for _, n := range inCode { // after: a function's overloads share a name
		delete(inDoc, n)
	}
	for n := range inDoc {
		p.addf("extra: %s %s is in the reference but not in the schema", what, n)
	}
}

// checkMentions fails for each match of pattern in doc that ok refuses.
func checkMentions(t *testing.T, d doc, pattern, what string, ok func(string) bool) {
	t.Helper()
	bad := map[string]bool{}
	for _, m := range regexp.MustCompile(pattern).FindAllString(d.text, -1) {
		m = strings.TrimLeft(m, " \t\n`([")
		if !ok(m) {
			bad[m] = true
		}
	}
	if len(bad) > 0 {
		var names []string
		for n := range bad {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Errorf("%s names %ss the code lacks: %s", d.path, what, strings.Join(names, ", "))
	}
}

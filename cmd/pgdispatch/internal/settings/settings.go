// Package settings reads the configuration of a pgdispatch command.
//
// A Setting is one value: an environment variable and the flag that
// overrides it. Flags win over the environment, which wins over .env (which
// the command loads into the environment first). Secrets have no flag, so
// that they never show in a process listing. Usage shows a flag's built-in
// default, never the environment's value, which may hold a password
// (DATABASE_URL); what is printed passes through the filter of package
// redact. A Setting's Help is its meaning in Markdown, from which the
// setting tables of docs/reference.md are generated (go test -run
// TestReference -update ./cmd/pgdispatch); --help prints it plain.
package settings

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pgdispatch/pgdispatch"
)

// Setting is one configuration value.
type Setting struct {
	Env, Flag, Default, Help string
	// Apply, of a worker's setting, parses its value into the worker's
	// config. Its default is the package's own, so that it is written once.
	Apply func(v *Values, cfg *pgdispatch.Config, errs *[]error)
	// StandsFor, of an AT Worker setting, is the pgdispatch setting it
	// stands in for, read in Unit ("s", "m", or "" for a count).
	StandsFor, Unit string
}

// Duration is a setting of a positive duration, field of the worker's
// config.
func Duration(env, flag string, def time.Duration, help string, field func(*pgdispatch.Config) *time.Duration) Setting {
	return Setting{
		Env: env, Flag: flag, Default: DurationText(def), Help: help,
		Apply: func(v *Values, cfg *pgdispatch.Config, errs *[]error) { *field(cfg) = v.PositiveDuration(env, errs) },
	}
}

// Count is a setting of a whole number above 0, field of the worker's
// config.
func Count(env, flag string, def int, help string, field func(*pgdispatch.Config) *int) Setting {
	return Setting{
		Env: env, Flag: flag, Default: strconv.Itoa(def), Help: help,
		Apply: func(v *Values, cfg *pgdispatch.Config, errs *[]error) { *field(cfg) = v.PositiveInt(env, errs) },
	}
}

// DurationText writes d as a setting's default is written: "30s", "5m",
// "1h", "168h".
func DurationText(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

// WithDefaults returns a copy of settings with other defaults, by variable.
func WithDefaults(settings []Setting, defaults map[string]string) []Setting {
	out := make([]Setting, len(settings))
	copy(out, settings)
	for i := range out {
		if d, ok := defaults[out[i].Env]; ok {
			out[i].Default = d
		}
	}
	return out
}

// Only returns the settings of settings named by names.
func Only(settings []Setting, names ...string) []Setting {
	var out []Setting
	for _, s := range settings {
		for _, n := range names {
			if s.Env == n {
				out = append(out, s)
			}
		}
	}
	return out
}

// Values holds the settings of one command once its flags are parsed.
type Values struct {
	fs    *flag.FlagSet
	vals  map[string]*string // by env name
	flags map[string]string  // flag names, by env name
}

// New registers the flags of the settings of groups on fs, and holds their
// values: the flag's once fs is parsed, else the environment's, else the
// default.
func New(fs *flag.FlagSet, groups ...[]Setting) *Values {
	v := &Values{fs: fs, vals: map[string]*string{}, flags: map[string]string{}}
	for _, g := range groups {
		for _, s := range g {
			def := s.Default
			if e, ok := os.LookupEnv(s.Env); ok {
				def = e
			}
			if s.Flag == "" {
				v.vals[s.Env] = &def
				continue
			}
			// Registered with the built-in default, which usage prints; the
			// environment's value is set after.
			p := fs.String(s.Flag, s.Default, plain(s.Help)+" ($"+s.Env+")")
			*p = def
			v.vals[s.Env], v.flags[s.Env] = p, s.Flag
		}
	}
	return v
}

var (
	markdownLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)    // [text](target)
	seeAlso      = regexp.MustCompile(` \(\[[^\]]*\]\([^)]*\)\)`) // " ([text](target))"
)

// plain is help without its Markdown: no pointer to elsewhere in the docs,
// links' text, and code spans' code.
func plain(help string) string {
	help = markdownLink.ReplaceAllString(seeAlso.ReplaceAllString(help, ""), "$1")
	return strings.ReplaceAll(help, "`", "")
}

// Output is where the command writes what it has to say: its flag set's
// output.
func (v *Values) Output() io.Writer { return v.fs.Output() }

// Str is the value of the setting env, without surrounding space.
func (v *Values) Str(env string) string { return strings.TrimSpace(*v.vals[env]) }

// Has reports whether the command reads the setting env.
func (v *Values) Has(env string) bool { _, ok := v.vals[env]; return ok }

// Given reports whether the environment or a flag sets env, rather than
// its default.
func (v *Values) Given(env string) bool {
	_, given := os.LookupEnv(env)
	v.fs.Visit(func(f *flag.Flag) { given = given || f.Name == v.flags[env] })
	return given
}

// Set sets the value of env, a setting the command reads.
func (v *Values) Set(env, value string) { *v.vals[env] = value }

// Duration is the value of env as a duration that is not negative (a Go
// duration or a whole number of seconds); a bad one is added to errs.
func (v *Values) Duration(env string, errs *[]error) time.Duration {
	d, err := parseDuration(v.Str(env))
	if err != nil {
		*errs = append(*errs, fmt.Errorf("invalid %s %q: %w", env, v.Str(env), err))
	}
	return d
}

// PositiveDuration is Duration, which must be more than 0.
func (v *Values) PositiveDuration(env string, errs *[]error) time.Duration {
	d, err := parseDuration(v.Str(env))
	if err == nil && d == 0 {
		err = errors.New("must be more than 0")
	}
	if err != nil {
		*errs = append(*errs, fmt.Errorf("invalid %s %q: %w", env, v.Str(env), err))
	}
	return d
}

// PositiveInt is the value of env as a whole number above 0; a bad one is
// added to errs.
func (v *Values) PositiveInt(env string, errs *[]error) int {
	n, err := strconv.Atoi(v.Str(env))
	if err != nil || n <= 0 {
		*errs = append(*errs, fmt.Errorf("invalid %s %q: must be a whole number above 0", env, v.Str(env)))
	}
	return n
}

// parseDuration reads a Go duration ("30s", "5m") or a whole number of
// seconds, as the AT Worker's settings were.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if n, nerr := strconv.Atoi(s); nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	switch {
	case err != nil:
		return 0, errors.New(`want a duration such as "30s" or "5m", or a number of seconds`)
	case d < 0:
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

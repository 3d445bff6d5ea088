package settings

import (
	"bytes"
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
)

var group = []Setting{
	{Env: "PGD_TEST_FLAGGED", Flag: "flagged", Default: "built-in", Help: "a `code` span and a link ([the docs](x.md#y))"},
	{Env: "PGD_TEST_SECRET", Help: "no flag"},
	Duration("PGD_TEST_WAIT", "wait", 90*time.Second, "a wait", func(c *pgdispatch.Config) *time.Duration { return &c.Lease }),
	Count("PGD_TEST_COUNT", "count", 3, "a count", func(c *pgdispatch.Config) *int { return &c.Concurrency }),
}

func parse(t *testing.T, args ...string) (*Values, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&out)
	v := New(fs, group)
	require.NoError(t, fs.Parse(args))
	return v, &out
}

// A flag wins over the environment, which wins over the default; usage
// shows the built-in default, never the environment's value, and the help
// without its Markdown.
func TestPrecedence(t *testing.T) {
	t.Setenv("PGD_TEST_SECRET", " from the environment ")
	v, _ := parse(t)
	require.Equal(t, "built-in", v.Str("PGD_TEST_FLAGGED"))
	require.Equal(t, "from the environment", v.Str("PGD_TEST_SECRET"))
	require.False(t, v.Given("PGD_TEST_FLAGGED"))
	require.True(t, v.Given("PGD_TEST_SECRET"))
	require.True(t, v.Has("PGD_TEST_SECRET"))
	require.False(t, v.Has("PGD_TEST_OTHER"))

	t.Setenv("PGD_TEST_FLAGGED", "password in the environment")
	v, out := parse(t)
	require.Equal(t, "password in the environment", v.Str("PGD_TEST_FLAGGED"))
	require.True(t, v.Given("PGD_TEST_FLAGGED"))
	v.fs.PrintDefaults()
	require.Contains(t, out.String(), `a code span and a link ($PGD_TEST_FLAGGED) (default "built-in")`)
	require.NotContains(t, out.String(), "password")
	require.NotContains(t, out.String(), "PGD_TEST_SECRET", "a setting without a flag has none")

	v, _ = parse(t, "--flagged", "from the flag")
	require.Equal(t, "from the flag", v.Str("PGD_TEST_FLAGGED"))
	v.Set("PGD_TEST_FLAGGED", "set")
	require.Equal(t, "set", v.Str("PGD_TEST_FLAGGED"))
}

// A flag given with its default's value is given all the same.
func TestGivenByFlag(t *testing.T) {
	v, _ := parse(t, "--wait", "90s")
	require.True(t, v.Given("PGD_TEST_WAIT"))
	require.False(t, v.Given("PGD_TEST_COUNT"))
}

// Durations are Go durations or whole seconds; a worker's setting parses
// into its field of the config; a bad value is an error that names the
// variable.
func TestValues(t *testing.T) {
	v, _ := parse(t, "--wait", "45", "--count", "7")
	var cfg pgdispatch.Config
	var errs []error
	for _, s := range group {
		if s.Apply != nil {
			s.Apply(v, &cfg, &errs)
		}
	}
	require.Empty(t, errs)
	require.Equal(t, 45*time.Second, cfg.Lease)
	require.Equal(t, 7, cfg.Concurrency)

	for text, want := range map[string]string{
		"0":    `invalid PGD_TEST_WAIT "0": must be more than 0`,
		"-1s":  `invalid PGD_TEST_WAIT "-1s": must not be negative`,
		"soon": `invalid PGD_TEST_WAIT "soon": want a duration such as "30s" or "5m", or a number of seconds`,
	} {
		v, _ := parse(t, "--wait", text)
		errs = nil
		v.PositiveDuration("PGD_TEST_WAIT", &errs)
		require.Len(t, errs, 1)
		require.EqualError(t, errs[0], want)
	}
	v, _ = parse(t, "--wait", "0")
	errs = nil
	require.Zero(t, v.Duration("PGD_TEST_WAIT", &errs))
	require.Empty(t, errs, "0 is a duration, not a positive one")
	v, _ = parse(t, "--count", "0")
	errs = nil
	v.PositiveInt("PGD_TEST_COUNT", &errs)
	require.EqualError(t, errs[0], `invalid PGD_TEST_COUNT "0": must be a whole number above 0`)
}

// Defaults are written as the reference shows them, and a command can
// change them or take a few settings of a group.
func TestDefaults(t *testing.T) {
	require.Equal(t, "1m30s", group[2].Default)
	require.Equal(t, "3", group[3].Default)
	for d, want := range map[time.Duration]string{30 * time.Second: "30s", 5 * time.Minute: "5m", 168 * time.Hour: "168h", 1500 * time.Millisecond: "1.5s"} {
		require.Equal(t, want, DurationText(d))
	}
	changed := WithDefaults(group, map[string]string{"PGD_TEST_FLAGGED": "other"})
	require.Equal(t, "other", changed[0].Default)
	require.Equal(t, "built-in", group[0].Default, "the original is left as it is")
	only := Only(group, "PGD_TEST_COUNT", "PGD_TEST_SECRET")
	require.Len(t, only, 2)
	require.Equal(t, "PGD_TEST_SECRET", only[0].Env, "in the group's order")
	require.Equal(t, "PGD_TEST_COUNT", only[1].Env)
}

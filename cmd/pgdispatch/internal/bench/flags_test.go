package bench

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The flags give DefaultOptions when none is set, what they say when set,
// and refuse what Run would, naming the flag.
func TestFlags(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) (Options, error) {
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f := AddFlags(fs)
		require.NoError(t, fs.Parse(args))
		return f.Options()
	}
	o, err := parse()
	require.NoError(t, err)
	require.Equal(t, DefaultOptions(), o)

	o, err = parse("--scenario", "soak, latency", "--writers", "2, 8", "--jobs", "7", "--soak-duration", "3s", "--flow-rate-duration", "5s", "--flow-workers", "2",
		"--flow-parts", "wakeups, concurrency", "--outage-length", "90s", "--outage-rate", "50", "--outage-rounds", "3", "--outage-cool-down", "5s", "--outage-timeout", "2s")
	require.NoError(t, err)
	require.Equal(t, []string{"wakeups", "concurrency"}, o.FlowParts)
	require.Equal(t, 5*time.Second, o.FlowRateDuration)
	require.Equal(t, 2, o.FlowWorkers)
	require.Equal(t, []string{"soak", "latency"}, o.Scenarios)
	require.Equal(t, []int{2, 8}, o.Writers)
	require.Equal(t, 7, o.Jobs)
	require.Equal(t, 3*time.Second, o.SoakDuration)
	require.Equal(t, 90*time.Second, o.OutageLength)
	require.Equal(t, 50, o.OutageRate)
	require.Equal(t, 3, o.OutageRounds)
	require.Equal(t, 5*time.Second, o.OutageCoolDown)
	require.Equal(t, 2*time.Second, o.OutageTimeout)

	for args, want := range map[[2]string]string{
		{"--scenario", "latency,nope"}:   `--scenario "nope": want some of latency, drain, floor, http, sustained, writers, idle, soak, xmin, flow, outage`,
		{"--writers", "4,0"}:             `--writers "4,0": want positive whole numbers`,
		{"--writers", "four"}:            `--writers "four": want positive whole numbers`,
		{"--drain-jobs", "0"}:            "--jobs, --drain-jobs, --duration, --idle-duration, --soak-duration, --soak-writers, --xmin-jobs, --xmin-lone and --xmin-pairs must be above 0",
		{"--xmin-dead", "5,1"}:           `--xmin-dead "5,1": want whole numbers, ascending`,
		{"--xmin-dead", "-1"}:            `--xmin-dead "-1": want whole numbers, ascending`,
		{"--flow-parts", "strict,fifo"}:  `--flow-parts "fifo": want some of concurrency, strict, rate, fair, wakeups`,
		{"--flow-keys", "0"}:             "--flow-jobs, --flow-keys, --flow-workers, --flow-strict-keys, --flow-strict-jobs and --flow-backlog must be above 0",
		{"--flow-rate-duration", "10ms"}: "--flow-rate must be from 1 to 10000, --flow-rate-duration at least 1s and --flow-wakeups at least 2",
		{"--outage-rate", "0"}:           "--outage-length, --outage-rounds, --outage-cool-down and --outage-timeout must be above 0, --outage-rate from 1 to 10000",
	} {
		_, err := parse(args[0], args[1])
		require.EqualError(t, err, want)
	}
}

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// serving is what the demo prints once its tour is over and it serves.
const serving = "Ctrl-C stops."

// Ctrl-C in a terminal sends SIGINT to the whole foreground process group:
// the demo, started in a group of its own, stops cleanly and exits 0.
func TestDemoInterruptedExitsZero(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	p := &proc{cmd: exec.Command(binary, "demo", "--interval", "50ms"), stdout: newSyncBuffer(), stderr: newSyncBuffer(), done: make(chan struct{})}
	p.cmd.Env = env("DATABASE_URL="+pgtest.URL(), "DB_SCHEMA="+schema)
	p.cmd.Dir = t.TempDir()
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	p.stdout.waitFor(t, serving, 2*time.Minute)
	require.NoError(t, syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT))
	require.Equal(t, 0, p.wait(t, time.Minute), "exit status after SIGINT; stderr:\n%s", p.stderr.String())
	require.Contains(t, p.stdout.String(), "Jobs by status:", "the demo printed its summary")
}

// `make demo` stopped with Ctrl-C, as the README says, as a person does it:
// make runs in a terminal (a pseudo-terminal here, whose session it leads),
// and the Ctrl-C typed into it reaches whatever the terminal's foreground
// process group holds. make then exits 0 and reports no error.
func TestMakeDemoCtrlC(t *testing.T) {
	t.Parallel()
	makeBin, err := exec.LookPath("make")
	require.NoError(t, err, "make is needed to run the README's commands")
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	master, slave := openPTY(t)

	cmd := exec.Command(makeBin, "demo")
	cmd.Dir = root
	cmd.Env = env("DATABASE_URL="+pgtest.URL(), "DB_SCHEMA="+pgtest.EmptySchemaName(t), "TERM=dumb")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, cmd.Start())
	require.NoError(t, slave.Close())
	out := newSyncBuffer()
	read := make(chan struct{})
	go func() { defer close(read); _, _ = io.Copy(out, master) }() // until EIO: the terminal's last process is gone
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = master.Close() // hangs up the terminal: whatever is left on it gets SIGHUP
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})

	out.waitFor(t, serving, 5*time.Minute) // make builds the binary first
	_, err = master.Write([]byte{0x03})    // Ctrl-C, typed
	require.NoError(t, err)
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("make demo went on after Ctrl-C:\n%s", out.String())
	}
	<-read
	text := out.String()
	t.Logf("make demo, the end:\n%s", text[max(0, len(text)-400):])
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("make demo ended with %v after Ctrl-C:\n%s", exit, text[max(0, len(text)-1000):])
	}
	require.NoError(t, err)
	require.NotContains(t, text, "make: ***")
	require.Contains(t, text, "Jobs by status:", "the demo printed its summary")
}

// openPTY opens a pseudo-terminal pair: the master end, which the test
// types into and reads, and the slave end, the terminal of the process.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	fd := int(master.Fd())
	require.NoError(t, unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)) // unlockpt
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)                       // ptsname
	require.NoError(t, err)
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	return master, slave
}

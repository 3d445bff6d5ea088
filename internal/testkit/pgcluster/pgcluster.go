// Package pgcluster starts a throwaway PostgreSQL cluster from the server
// binaries installed on the machine: initdb and pg_ctl in a temporary
// directory, on a free port, removed by Stop, or by a reaper process when
// the process that started it ends without Stop. initdb and postgres refuse
// to run as root, so under root the cluster runs as the "postgres" user.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// ErrNoServer means no PostgreSQL server binaries were found.
var ErrNoServer = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin: " +
	"install them (Debian: apt-get install postgresql) or point DATABASE_URL at a server")

// Options tunes a cluster.
type Options struct {
	// Durable keeps fsync on. Off by default: a throwaway cluster need not
	// survive a machine crash, and tests run faster without it.
	Durable bool
	// Settings are extra postgres -c settings, such as "max_connections=300".
	Settings []string
}

// Cluster is a running throwaway cluster.
type Cluster struct {
	dir  string
	data string
	bin  string
	port int
	cred *syscall.Credential
	// reaper stops the server and removes dir once reaperPipe closes, which
	// the kernel does when this process ends, however it ends.
	reaper     *exec.Cmd
	reaperPipe *os.File
	crashed    bool // Crash stopped the server
}

// Start creates and starts a cluster.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	return start(ctx, opts, func(c *Cluster) error {
		if out, err := c.command(ctx, "initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
			return fmt.Errorf("initdb: %w\n%s", err, out)
		}
		return nil
	})
}

// StartStandby creates a streaming standby of c from a base backup
// (pg_basebackup -R, which writes its primary_conninfo) and starts it, with
// opts for its own settings: a hot standby that serves reads, until Promote.
// The standby's max_connections must be at least the primary's, as
// PostgreSQL requires; the default is the same on both. To make it
// synchronous, set synchronous_standby_names on c (ALTER SYSTEM), since the
// standby's walreceiver connects as "walreceiver" unless cluster_name is set.
func (c *Cluster) StartStandby(ctx context.Context, opts Options) (*Cluster, error) {
	return start(ctx, opts, func(s *Cluster) error {
		out, err := s.command(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
			"-D", s.data, "-R", "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput()
		if err != nil {
			return fmt.Errorf("pg_basebackup from port %d: %w\n%s", c.port, err, out)
		}
		return nil
	})
}

// start makes the cluster's directory, fills its data directory with
// create, and starts the server on a free port.
func start(ctx context.Context, opts Options, create func(*Cluster) error) (c *Cluster, err error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgdispatch-pg-")
	if err != nil {
		return nil, fmt.Errorf("throwaway cluster: %w", err)
	}
	c = &Cluster{dir: dir, data: filepath.Join(dir, "data"), bin: bin, cred: cred}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("throwaway cluster: hand %s to the postgres user: %w", dir, err)
		}
	}
	if err := create(c); err != nil {
		return nil, fmt.Errorf("throwaway cluster: %w", err)
	}
	c.port, err = freePort()
	if err != nil {
		return nil, fmt.Errorf("throwaway cluster: %w", err)
	}
	settings := []string{"listen_addresses=127.0.0.1", "max_connections=300"}
	if !opts.Durable {
		settings = append(settings, "fsync=off", "full_page_writes=off")
	}
	settings = append(settings, opts.Settings...)
	args := fmt.Sprintf("-p %d -k %s", c.port, dir)
	for _, s := range settings {
		args += " -c " + s
	}
	if out, err := c.command(ctx, "pg_ctl", "-D", c.data, "-l", filepath.Join(dir, "postgres.log"), "-w", "-t", "60", "-o", args, "start").CombinedOutput(); err != nil {
		logText, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
		return nil, fmt.Errorf("throwaway cluster: pg_ctl start: %w\n%s\n%s", err, out, logText)
	}
	if err := c.startReaper(); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// reaperScript waits for its standard input to close, then stops the server
// and removes its directory. After Stop it finds nothing left to do.
const reaperScript = `read -r _; "$0" -D "$1" -m immediate stop >/dev/null 2>&1; rm -rf "$2"`

// startReaper starts the process that stops the server if this one ends
// without Stop: killed, or exiting from a failed test. Its standard input is
// a pipe whose only writer is this process. It runs in a process group of
// its own, so that the Ctrl-C meant for this process does not end it.
func (c *Cluster) startReaper() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("throwaway cluster: reaper pipe: %w", err)
	}
	defer r.Close() //nolint:errcheck // the child holds its own copy
	cmd := exec.Command("/bin/sh", "-c", reaperScript, filepath.Join(c.bin, "pg_ctl"), c.data, c.dir)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	if err := cmd.Start(); err != nil {
		_ = w.Close()
		return fmt.Errorf("throwaway cluster: start the reaper: %w", err)
	}
	c.reaper, c.reaperPipe = cmd, w
	return nil
}

// URL is a connection string for the cluster's postgres database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port is the port the server listens on, at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Dir is the directory that holds the cluster's data and log; Stop removes it.
func (c *Cluster) Dir() string { return c.dir }

// LogPath is the server's log file.
func (c *Cluster) LogPath() string { return filepath.Join(c.dir, "postgres.log") }

// Stop stops the server, unless Crash did, and removes its directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []byte
	var err error
	if !c.crashed {
		out, err = c.command(ctx, "pg_ctl", "-D", c.data, "-w", "-m", "fast", "stop").CombinedOutput()
	}
	rmErr := os.RemoveAll(c.dir)
	if c.reaper != nil {
		_ = c.reaperPipe.Close()
		_ = c.reaper.Wait()
		c.reaper = nil
	}
	if err != nil {
		return fmt.Errorf("throwaway cluster: pg_ctl stop: %w\n%s", err, out)
	}
	return rmErr
}

// Crash stops the server as a crash of its machine would, as far as its
// clients can tell: pg_ctl stop -m immediate, which ends every process of
// the server at once, with no checkpoint and no goodbye to the sessions.
// The directory stays until Stop.
func (c *Cluster) Crash(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "-D", c.data, "-w", "-m", "immediate", "stop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("throwaway cluster: pg_ctl stop -m immediate: %w\n%s", err, out)
	}
	c.crashed = true
	return nil
}

// Promote makes a standby a primary (pg_ctl promote) and waits until it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "-D", c.data, "-w", "-t", "60", "promote").CombinedOutput()
	if err != nil {
		return fmt.Errorf("throwaway cluster: pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// Restart stops the server at once (pg_ctl restart -m fast: sessions are
// cut) and starts it again with the same settings.
func (c *Cluster) Restart(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "-D", c.data, "-l", filepath.Join(c.dir, "postgres.log"), "-w", "-t", "60", "-m", "fast", "restart").CombinedOutput()
	if err != nil {
		return fmt.Errorf("throwaway cluster: pg_ctl restart: %w\n%s", err, out)
	}
	return nil
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	// Stay out of the caller's process group, so that a Ctrl-C meant for the
	// caller does not stop the server before the caller's shutdown is done.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	return cmd
}

// findBin finds the directory of initdb, pg_ctl and the other server
// binaries: PATH first, then the
// newest /usr/lib/postgresql/*/bin.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			// The directory of the real binaries, which holds pg_basebackup
			// too, even when PATH reaches initdb through a link.
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real
			}
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	return "", ErrNoServer
}

func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// credential is nil for an ordinary user, and the postgres user under root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("throwaway cluster: running as root, and PostgreSQL refuses root; no \"postgres\" user to run it as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("throwaway cluster: postgres user: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

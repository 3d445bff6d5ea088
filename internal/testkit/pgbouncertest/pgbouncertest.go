// Package pgbouncertest puts a real PgBouncer in transaction pooling mode in
// front of the tests' PostgreSQL.
//
// Start runs the machine's pgbouncer (Debian: apt-get install pgbouncer;
// .ci/run installs it) on a free port of 127.0.0.1 from a directory of its
// own, with the settings a default install has except the ones it needs to
// pool transactions for one database: no ignore_startup_parameters, and so
// no protocol-level prepared statements on 1.18. PgBouncer refuses to run as
// root, so under root it runs as the "postgres" user (else "nobody"), as
// package pgcluster runs PostgreSQL. Without pgbouncer the test fails: it
// never passes by skipping.
package pgbouncertest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// startTimeout bounds one start of pgbouncer, until it listens.
const startTimeout = 30 * time.Second

// Bouncer is a running PgBouncer.
type Bouncer struct {
	url  string
	port int

	log logBuffer // pgbouncer's stderr: it logs there
}

// URL is a connection string to the database through PgBouncer, as the user
// that target named. Any pgx setting can be added to its query.
func (b *Bouncer) URL() string { return b.url }

// Port is the port PgBouncer listens on, on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// Log is what PgBouncer has logged so far.
func (b *Bouncer) Log() string { return b.log.String() }

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(line)
	l.b.WriteByte('\n')
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start starts PgBouncer in transaction pooling mode in front of the
// database that target (a connection string) names, and stops it when the
// test ends. It logs PgBouncer's output if the test failed.
func Start(t testing.TB, target string) *Bouncer {
	t.Helper()
	bin, err := find()
	if err != nil {
		t.Fatalf("pgbouncertest: %v", err)
	}
	server, err := pgconn.ParseConfig(target)
	if err != nil {
		t.Fatalf("pgbouncertest: target: %v", err)
	}
	cred, err := credential()
	if err != nil {
		t.Fatalf("pgbouncertest: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgdispatch-pgbouncer-")
	if err != nil {
		t.Fatalf("pgbouncertest: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("pgbouncertest: %v", err)
		}
	}
	// A free port can be taken between its check and pgbouncer's bind: try
	// a few.
	for try := 1; ; try++ {
		b, stop, err := start(bin, dir, cred, server)
		if err == nil {
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("pgbouncer's log:\n%s", b.Log())
				}
			})
			return b
		}
		if try == 5 || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("pgbouncertest: %v", err)
		}
	}
}

// find returns pgbouncer's path, also where Debian puts it outside a
// non-root PATH.
func find() (string, error) {
	path, err := exec.LookPath("pgbouncer")
	if err == nil {
		return path, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if _, statErr := os.Stat(debian); statErr == nil {
		return debian, nil
	}
	return "", fmt.Errorf("pgbouncer is not installed (%v): install it (Debian: apt-get install pgbouncer; .ci/run does so)", err)
}

// credential is the user pgbouncer runs as under root, which it refuses;
// nil otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("user %s: %w", name, err)
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("running as root, which pgbouncer refuses, and no user to run it as: %w", errors.Join(errs...))
}

// plainValue is what start writes into pgbouncer.ini unquoted.
var plainValue = regexp.MustCompile(`^[A-Za-z0-9_./:-]*$`)

// start runs pgbouncer once, on a port it picks, and waits until it
// listens. stop ends it and waits for it.
func start(bin, dir string, cred *syscall.Credential, server *pgconn.Config) (b *Bouncer, stop func(), err error) {
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	db := map[string]string{
		"host": server.Host, "port": strconv.Itoa(int(server.Port)),
		"dbname": server.Database, "user": server.User, "password": server.Password,
	}
	var conn []string
	for _, k := range []string{"host", "port", "dbname", "user", "password"} {
		if db[k] == "" {
			continue
		}
		if !plainValue.MatchString(db[k]) {
			return nil, nil, fmt.Errorf("the target's %s holds characters this helper does not quote for pgbouncer.ini", k)
		}
		conn = append(conn, k+"="+db[k])
	}
	if !plainValue.MatchString(server.Database) || server.Database == "" {
		return nil, nil, fmt.Errorf("the target's database name %q is not one this helper writes into pgbouncer.ini", server.Database)
	}
	// auth_type any: clients are not asked for a password, and pgbouncer logs
	// in as the user of the database's line.
	ini := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
logfile =
pidfile =
log_connections = 0
log_disconnections = 0
`, server.Database, strings.Join(conn, " "), port)
	cfgPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(cfgPath, []byte(ini), 0o600); err != nil {
		return nil, nil, err
	}
	if cred != nil {
		if err := os.Chown(cfgPath, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, nil, err
		}
	}

	u := url.URL{Scheme: "postgres", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: "/" + server.Database}
	if server.Password != "" {
		u.User = url.UserPassword(server.User, server.Password)
	} else {
		u.User = url.User(server.User)
	}
	u.RawQuery = "sslmode=disable"
	b = &Bouncer{url: u.String(), port: port}

	cmd := exec.Command(bin, cfgPath)
	cmd.Dir = dir
	// Pdeathsig: a test binary that dies leaves no pgbouncer behind. It is
	// set after the switch to cred, which would clear it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	up := make(chan struct{})
	exited := make(chan struct{})
	var waitErr error
	go func() {
		defer close(exited)
		s := bufio.NewScanner(stderr)
		seen := false
		for s.Scan() {
			line := s.Text()
			b.log.add(line)
			if !seen && strings.Contains(line, "process up") {
				seen = true
				close(up)
			}
		}
		waitErr = cmd.Wait() // after every read of the pipe
	}()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // a fast exit: clients are cut
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	select {
	case <-up:
		return b, stop, nil
	case <-exited:
		return nil, nil, fmt.Errorf("pgbouncer exited before it listened (%v):\n%s", waitErr, b.Log())
	case <-time.After(startTimeout):
		stop()
		return nil, nil, fmt.Errorf("pgbouncer did not listen within %s:\n%s", startTimeout, b.Log())
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

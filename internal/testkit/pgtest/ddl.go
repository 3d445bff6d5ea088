package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// ddl is the time the test binary spent on schema DDL: migrating schemas
// (and noting what a reused one is made of), readying a schema for the next
// test (the Watch trigger's removal included), and dropping schemas. With
// PGTEST_DDL_LOG set to a file, Main appends one line of these figures to
// it when the binary ends, so that a run of `go test ./...` can be summed
// up (go test shows a passing package's output only with -v).
var ddl ddlStats

type ddlStats struct {
	mu                            sync.Mutex
	migrate, inspect, reset, drop ddlStat
	notReused                     map[string]int // why schemas were dropped instead of reused
}

type ddlStat struct {
	n    int
	took time.Duration
}

func (d *ddlStats) add(s *ddlStat, began time.Time) { d.addN(s, 1, began) }

func (d *ddlStats) addN(s *ddlStat, n int, began time.Time) {
	took := time.Since(began)
	d.mu.Lock()
	defer d.mu.Unlock()
	s.n += n
	s.took += took
}

// discarded counts a schema dropped instead of reused, by the first words
// of the reason.
func (d *ddlStats) discarded(reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.notReused == nil {
		d.notReused = map[string]int{}
	}
	kind, _, _ := strings.Cut(reason, ":")
	d.notReused[kind]++
}

func (d *ddlStats) report() error {
	path := os.Getenv("PGTEST_DDL_LOG")
	if path == "" {
		return nil
	}
	pkg, err := packageDir()
	if err != nil {
		return err
	}
	d.mu.Lock()
	line := fmt.Sprintf("%s migrate=%d/%.0fms inspect=%d/%.0fms reset=%d/%.0fms drop=%d/%.0fms total=%.0fms not_reused=%v\n", pkg,
		d.migrate.n, ms(d.migrate.took), d.inspect.n, ms(d.inspect.took), d.reset.n, ms(d.reset.took), d.drop.n, ms(d.drop.took),
		ms(d.migrate.took+d.inspect.took+d.reset.took+d.drop.took), d.notReused)
	d.mu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// packageDir is the test's package directory, relative to the module's
// root: go test runs a test binary in its package's directory.
func packageDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Rel(dir, wd)
		}
		if filepath.Dir(dir) == dir {
			return wd, nil
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

package pgdispatch_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pgdispatch/pgdispatch/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(leakCheck{m})
}

// leakCheck fails the test binary when the tests leave goroutines behind.
type leakCheck struct{ m *testing.M }

func (l leakCheck) Run() int {
	ignore := goleak.IgnoreCurrent()
	code := l.m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(ignore, goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}

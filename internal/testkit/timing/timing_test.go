package timing

import (
	"fmt"
	"testing"
	"time"
)

// recorder is a testing.TB that notes its errors.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Errorf(f string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(f, args...))
}

func TestBelowChecksOnlyWhenAskedTo(t *testing.T) {
	for _, tc := range []struct {
		env    string
		d      time.Duration
		failed bool
	}{
		{"", time.Second, false},
		{"0", time.Second, false},
		{"1", time.Second, true},
		{"1", time.Millisecond, false},
	} {
		t.Run(fmt.Sprintf("%s=%q,%s", Env, tc.env, tc.d), func(t *testing.T) {
			t.Setenv(Env, tc.env)
			r := &recorder{TB: t}
			Below(r, "the thing", tc.d, 100*time.Millisecond)
			if got := len(r.errors) > 0; got != tc.failed {
				t.Fatalf("failed: %v, want %v (%v)", got, tc.failed, r.errors)
			}
		})
	}
}

package pgdispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
)

// A listen URL that names other servers than the pool's URL says the
// pool's URL leads to a transaction pooler; the servers of a multi-host
// URL are a set.
func TestBehindPooler(t *testing.T) {
	t.Parallel()
	const direct = "postgres://app@db:5432/app"
	for _, tc := range []struct {
		db, listen string
		want       bool
	}{
		{direct, "", false},
		{direct, direct, false},
		{direct, "postgres://other@db/app?application_name=x", false}, // the same server
		{"postgres://app@pgbouncer:6432/app", direct, true},
		{"postgres://app@db:6432/app", direct, true},
		{"host=pgbouncer port=5432 user=app", direct, true},
		{"postgres://app@db1:5432,db2:5432/app", "postgres://app@db2:5432,db1:5432/app", false},
		{"host=db1,db2 port=5432,5433 user=app", "postgres://app@db2:5433,db1:5432/app", false},
		{"postgres://app@db1:5432,db2:5432/app", "postgres://app@db1:5432,pgbouncer:6432/app", true},
		{"postgres://app@db1:5432/app", "postgres://app@db1:5432,db2:5432/app", true},
	} {
		require.Equal(t, tc.want, pgdispatch.BehindPooler(tc.db, tc.listen), "%s, %s", tc.db, tc.listen)
	}
}

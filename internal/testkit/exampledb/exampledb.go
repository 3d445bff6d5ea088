// Package exampledb gives each runnable example a database of its own on
// the tests' server (see package pgtest), so that examples can use the
// default schema and the package-level functions as a program does.
package exampledb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// New creates an empty database and returns its URL, and a function that
// drops it, ending any session left in it. It panics when the server
// refuses: an example has no *testing.T to fail.
func New() (databaseURL string, drop func()) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pgdispatch_example_" + hex.EncodeToString(b)
	exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize())
	return withDatabase(pgtest.URL(), name), func() {
		exec("DROP DATABASE " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)")
	}
}

// exec runs one statement on the tests' server.
func exec(sql string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		panic(fmt.Sprintf("exampledb: %v", err))
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, sql); err != nil {
		panic(fmt.Sprintf("exampledb: %s: %v", sql, err))
	}
}

// withDatabase returns connection string s naming database name instead.
func withDatabase(s, name string) string {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return strings.TrimSpace(s) + " dbname=" + name // keyword/value form: the last one wins
}

// Package stmttimeout holds the one default bound of a database call,
// which every package of pgdispatch uses and package pgdispatch exports as
// DefaultStatementTimeout.
package stmttimeout

import "time"

// Default bounds each database call unless configured otherwise.
const Default = 10 * time.Second

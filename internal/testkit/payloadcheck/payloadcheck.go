// Package payloadcheck holds what the executors' fuzz tests assert of a
// payload validator's errors.
package payloadcheck

import (
	"errors"
	"strings"

	"github.com/pgdispatch/pgdispatch/executors"
)

// Check reports what is wrong, if anything, with an error a
// payload validator returned: it must be permanent and name the payload. For
// the executors' fuzz tests.
func Check(err error) string {
	if err == nil {
		return ""
	}
	var p *executors.PermanentError
	if !errors.As(err, &p) {
		return "not permanent: " + err.Error()
	}
	if !strings.HasPrefix(err.Error(), "payload") {
		return "does not name the payload field: " + err.Error()
	}
	return ""
}

package pgdispatch_test

import (
	"testing"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

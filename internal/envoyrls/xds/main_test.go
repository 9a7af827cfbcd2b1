package xds

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a client or server goroutine outlives its
// test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

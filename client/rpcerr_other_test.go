//go:build !(linux && (amd64 || arm64))

package client

import (
	"errors"
	"net"
)

// waitReset is only written for Linux; the test that needs it skips.
func waitReset(*net.TCPConn) error { return errors.ErrUnsupported }

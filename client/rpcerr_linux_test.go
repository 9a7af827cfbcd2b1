//go:build linux && (amd64 || arm64)

package client

import (
	"fmt"
	"net"
	"syscall"
	"unsafe"
)

// tcpClose is Linux's TCP_CLOSE, the first byte of struct tcp_info.
const tcpClose = 7

// waitReset waits until conn's socket has taken the peer's reset, without
// reading (which would consume the pending ECONNRESET): the next write
// then fails with "connection reset by peer".
func waitReset(conn *net.TCPConn) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Read(func(fd uintptr) bool {
		var info [256]byte
		n := uint32(len(info))
		_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
		if errno != 0 {
			serr = fmt.Errorf("getsockopt TCP_INFO: %w", errno)
			return true
		}
		return info[0] == tcpClose // else wait until the socket is readable
	})
	if err != nil {
		return err
	}
	return serr
}

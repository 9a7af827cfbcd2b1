package netutil

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

func setUserTimeout(fd int, d time.Duration) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds())); err != nil {
		return fmt.Errorf("set TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}

func getUserTimeout(fd int) (time.Duration, error) {
	v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	if err != nil {
		return 0, fmt.Errorf("get TCP_USER_TIMEOUT: %w", err)
	}
	return time.Duration(v) * time.Millisecond, nil
}

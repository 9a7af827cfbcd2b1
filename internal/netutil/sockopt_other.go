//go:build !linux

package netutil

import "time"

// TCP_USER_TIMEOUT is Linux's; elsewhere keepalive alone detects a silent
// peer.
func setUserTimeout(int, time.Duration) error { return nil }

func getUserTimeout(int) (time.Duration, error) { return 0, nil }

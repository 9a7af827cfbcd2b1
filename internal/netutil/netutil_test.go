package netutil

import (
	"runtime"
	"testing"
	"time"
)

// TestIssue20Item15_UserTimeoutOnBothEnds checks that dialed and accepted
// node-to-node connections carry TCP_USER_TIMEOUT, so a silently dropped
// peer fails them within seconds.
func TestIssue20Item15_UserTimeoutOnBothEnds(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_USER_TIMEOUT is Linux's")
	}
	for _, tc := range []struct {
		name string
		o    Options
		want time.Duration
	}{
		{"default", DefaultOptions(), 5 * time.Second},
		{"custom", Options{UserTimeout: 1500 * time.Millisecond, KeepAliveIdle: time.Second, KeepAliveInterval: time.Second, KeepAliveCount: 2}, 1500 * time.Millisecond},
		{"off", Options{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := Listen(tc.o, "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					accepted <- err
					return
				}
				defer c.Close()
				d, err := UserTimeout(c)
				if err == nil && d != tc.want {
					t.Errorf("accepted connection: user timeout %v, want %v", d, tc.want)
				}
				accepted <- err
			}()
			c, err := DialTimeout(tc.o, ln.Addr().String(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if d, err := UserTimeout(c); err != nil || d != tc.want {
				t.Errorf("dialed connection: user timeout %v (%v), want %v", d, err, tc.want)
			}
			if err := <-accepted; err != nil {
				t.Fatal(err)
			}
		})
	}
}

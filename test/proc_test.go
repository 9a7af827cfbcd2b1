//go:build multiprocess

// Package e2e holds the multi-process tests: they start the real tokenserver
// and tokenctl binaries (built by `make build` into $TOKENSERVER_BIN) on
// 127.0.0.1 and drive them as an operator would.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bin returns the path of a built binary.
func bin(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("TOKENSERVER_BIN")
	if dir == "" {
		t.Skip("TOKENSERVER_BIN is not set: run through `make test-multiprocess`")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("binary %s: %v (run `make build`)", p, err)
	}
	return p
}

// serverProc is a running tokenserver process.
type serverProc struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	exited   chan error
	logs     *bytes.Buffer
}

// startServer runs tokenserver with args (plus JSON logs) and waits until
// it logs that it serves, reading its addresses from that line.
func startServer(t *testing.T, args ...string) *serverProc {
	t.Helper()
	return startServerCmd(t, exec.Command(bin(t, "tokenserver"), append([]string{"--log-format", "json"}, args...)...))
}

// startServerCmd is startServer for a prepared command (tokenserver run
// through `ip netns exec`, say).
func startServerCmd(t *testing.T, cmd *exec.Cmd) *serverProc {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &serverProc{cmd: cmd, exited: make(chan error, 1), logs: &bytes.Buffer{}}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			s.logs.Write(append(line, '\n'))
			var rec map[string]any
			if json.Unmarshal(line, &rec) == nil && rec["msg"] == "tokenserver serving" {
				s.grpcAddr, _ = rec["grpc"].(string)
				s.httpAddr, _ = rec["http"].(string)
				close(ready)
			}
		}
		s.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("tokenserver logs:\n%s", s.logs.String())
		}
	})
	select {
	case <-ready:
	case err := <-s.exited:
		t.Fatalf("tokenserver exited before serving: %v\n%s", err, s.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("tokenserver did not serve within 30s\n%s", s.logs.String())
	}
	return s
}

// stop sends SIGTERM and waits for a clean exit.
func (s *serverProc) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.exited:
		if err != nil {
			t.Fatalf("tokenserver exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tokenserver did not exit within 30s of SIGTERM")
	}
}

// ctl runs tokenctl against addr and returns stdout, stderr and the exit code.
func ctl(t *testing.T, addr string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t, "tokenctl"), append([]string{"--server", addr}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("tokenctl %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// ctlJSON runs tokenctl -o json, requires exit 0 and decodes stdout.
func ctlJSON(t *testing.T, addr string, args ...string) map[string]any {
	t.Helper()
	out, errs, code := ctl(t, addr, append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("tokenctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("tokenctl %s: stdout is not one JSON object: %v\n%s", strings.Join(args, " "), err, out)
	}
	return v
}

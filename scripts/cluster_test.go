// Package scripts holds the tests of the shell scripts beside it.
package scripts

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClusterStopWaitsThenKills: `cluster.sh stop` returns only once the
// nodes have exited: a node that exits on SIGTERM is waited for, and one
// that ignores it is sent SIGKILL after the grace, with a message.
func TestClusterStopWaitsThenKills(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	// n0 exits on SIGTERM after a moment (as a node drains); n1 ignores
	// SIGTERM. exec keeps the recorded pid the one that gets the signals.
	procs := map[string]string{
		"n0": `trap 'sleep 0.5; exit 0' TERM; echo ready; while :; do sleep 0.1; done`,
		"n1": `trap '' TERM; echo ready; exec sleep 60`,
	}
	exited := map[string]chan struct{}{}
	for name, script := range procs {
		cmd := exec.Command("sh", "-c", script)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The trap is installed once the shell says ready.
		if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		exited[name] = done
		// Reap the process as soon as it exits: a zombie still answers
		// kill -0.
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() { cmd.Process.Kill() })
		if err := os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stop := exec.Command("bash", "cluster.sh", "stop")
	stop.Env = append(os.Environ(), "CLUSTER_DIR="+dir, "CLUSTER_STOP_GRACE=2")
	start := time.Now()
	out, err := stop.CombinedOutput()
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("cluster.sh stop: %v\n%s", err, out)
	}
	for name, done := range exited {
		select {
		case <-done:
		default:
			t.Errorf("%s still runs after cluster.sh stop returned:\n%s", name, out)
		}
	}
	if !strings.Contains(string(out), "n1 (pid") || !strings.Contains(string(out), "after SIGTERM: sending SIGKILL") {
		t.Errorf("no SIGKILL message for n1:\n%s", out)
	}
	if strings.Contains(string(out), "\nn0 (pid") || strings.HasPrefix(string(out), "n0 (pid") {
		t.Errorf("n0 exited on SIGTERM but got SIGKILL:\n%s", out)
	}
	if elapsed > 10*time.Second {
		t.Errorf("stop took %v with a 2s grace", elapsed)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*.pid")); len(files) != 0 {
		t.Errorf("pid files left: %v", files)
	}
}

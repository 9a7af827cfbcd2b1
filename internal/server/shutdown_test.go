package server

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/test/bufconn"
)

// stuckControl is a control plane whose leader cannot be reached (Drain
// waits for its deadline) and whose Raft shutdown never ends (a write to
// a frozen peer), until release is closed.
type stuckControl struct {
	*Standalone
	release chan struct{}
}

func (s stuckControl) Drain(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func (s stuckControl) Close() error {
	<-s.release
	return nil
}

// TestIssue20Item16_StopIsBoundedByTheGrace: SIGTERM after a long
// partition must end within --shutdown-grace whatever the sockets do:
// leaving the view waits for an unreachable leader, and closing Raft
// blocks for good; Stop still returns within the grace.
func TestIssue20Item16_StopIsBoundedByTheGrace(t *testing.T) {
	for _, grace := range []time.Duration{time.Second, 2 * time.Second} {
		t.Run(grace.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.HTTPAddr = ""
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			cfg.ShutdownGrace = grace
			deps := NewStandalone("node-1", "bufnet", inmem(t, cfg.MaxRules)).Deps()
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			deps.Control = stuckControl{Standalone: deps.Control.(*Standalone), release: release}
			n, err := New(cfg, deps)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // SIGTERM as soon as it serves
			done := make(chan time.Time, 1)
			start := time.Now()
			go func() {
				_ = n.Serve(ctx, Listeners{GRPC: bufconn.Listen(1 << 16)})
				done <- time.Now()
			}()
			select {
			case end := <-done:
				if took := end.Sub(start); took > grace+250*time.Millisecond {
					t.Fatalf("stop took %v with a grace of %v", took, grace)
				}
			case <-time.After(grace + 5*time.Second):
				t.Fatalf("stop still running %v after SIGTERM, grace %v", grace+5*time.Second, grace)
			}
		})
	}
}

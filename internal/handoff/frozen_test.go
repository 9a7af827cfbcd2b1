package handoff

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestSendDropsFrozenOnceAcknowledged: the frozen copies of handed-over
// buckets leave the old owner once the new owner has acknowledged them
// (after Local.DropFrozenAfter), and only then.
func TestSendDropsFrozenOnceAcknowledged(t *testing.T) {
	const keys = 40
	for _, tc := range []struct {
		name      string
		after     time.Duration
		refused   bool // the new owner refuses the transfer
		wantLive  int64
		wantMoved bool
	}{
		{"acknowledged: dropped", -1, false, 0, false},
		{"acknowledged, within DropFrozenAfter: kept frozen", time.Hour, false, keys, true},
		{"not acknowledged: kept frozen", -1, true, keys, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, c := rules(t)
			a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, !tc.refused)
			a.l.DropFrozenAfter = tc.after
			for i := 0; i < keys; i++ {
				use(t, a, c, fmt.Sprintf("k%d", i), 30)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, _, err := Send(ctx, a.l, to(b), dial(t), 20*time.Millisecond)
			if (err != nil) != tc.refused {
				t.Fatalf("Send: %v, want an error: %v", err, tc.refused)
			}
			if got := a.l.Buckets.Live(); got != tc.wantLive {
				t.Fatalf("the old owner holds %d buckets after the handoff, want %d", got, tc.wantLive)
			}
			if held, moved := a.l.Buckets.Held("q", "k0"); held && moved != tc.wantMoved {
				t.Fatalf("k0 on the old owner: frozen %v, want %v", moved, tc.wantMoved)
			}
			if !tc.refused && use(t, b, c, "k0", 100) != 70 {
				t.Fatal("the new owner did not go on from the count handed over")
			}
		})
	}
}

// TestSendDropsFrozenKeyComesBack: a key whose frozen copy the old owner
// dropped comes back to it with a handoff back from the new owner: its
// count goes on, never fresh.
func TestSendDropsFrozenKeyComesBack(t *testing.T) {
	tbl, c := rules(t)
	a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, true)
	a.l.DropFrozenAfter, b.l.DropFrozenAfter = -1, -1
	admitted := use(t, a, c, "k", 60)
	if _, _, err := Send(context.Background(), a.l, to(b), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if a.l.Buckets.Live() != 0 {
		t.Fatalf("the old owner still holds %d buckets", a.l.Buckets.Live())
	}
	admitted += use(t, b, c, "k", 10)
	if _, _, err := Send(context.Background(), b.l, to(a), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if b.l.Buckets.Live() != 0 {
		t.Fatalf("the second old owner still holds %d buckets", b.l.Buckets.Live())
	}
	admitted += use(t, a, c, "k", 100)
	if admitted != 100 {
		t.Fatalf("admitted %d over a move and back, want exactly the limit 100", admitted)
	}
}

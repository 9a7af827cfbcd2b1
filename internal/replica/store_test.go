package replica

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
)

// fakeBudget is a bucket memory budget of max bytes.
type fakeBudget struct{ used, max int64 }

func (b *fakeBudget) ReserveBytes(n int64) bool {
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *fakeBudget) ReleaseBytes(n int64) { b.used -= n }

func copyOf(ruleName, key string, at int64, state int) Copy {
	return Copy{State: shard.BucketState{Rule: ruleName, Key: key, Generation: 1, Seq: 7, State: make([]byte, state)}, At: at}
}

// TestStoreBytes: the Store holds copies up to its byte limit and its
// budget; a copy that does not fit is dropped and counts, with its
// key's capacity, in DroppedPermits until a copy of the key fits or the
// key's window passes (the Store's clock, here a fake one).
func TestStoreBytes(t *testing.T) {
	one := (&stored{}).size("k0") // a copy of key k0..k9 with an inline state
	hour := int64(time.Hour)
	type step struct {
		op     string // put, take, permits
		key    string
		at     int64
		state  int   // state bytes of a put
		stored bool  // put: stored; take: found
		len    int64 // copies after the step
		drops  int64 // Dropped after the step
		permit int64 // permits: DroppedPermits at at
	}
	tests := []struct {
		name   string
		limit  int64
		budget int64 // 0: none
		steps  []step
	}{
		{"limit of two copies", 2 * one, 0, []step{
			{op: "put", key: "k1", stored: true, len: 1},
			{op: "put", key: "k2", stored: true, len: 2},
			{op: "put", key: "k3", stored: false, len: 2, drops: 1},
			{op: "permits", permit: 100, len: 2, drops: 1},
			{op: "put", key: "k2", at: 5, stored: true, len: 2, drops: 1}, // a newer copy replaces
			{op: "take", key: "k1", stored: true, len: 1, drops: 1},
			{op: "put", key: "k3", at: 6, stored: true, len: 2}, // fits again: no longer dropped
			{op: "permits", at: 6, permit: 0, len: 2},
		}},
		{"the budget is full before the limit", 10 * one, one, []step{
			{op: "put", key: "k1", stored: true, len: 1},
			{op: "put", key: "k2", stored: false, len: 1, drops: 1},
			{op: "permits", at: hour - 1, permit: 100, len: 1, drops: 1},
			{op: "permits", at: hour, permit: 0, len: 1}, // the window passed
		}},
		{"a long state takes more bytes", one + 10, 0, []step{
			{op: "put", key: "k1", state: 200, stored: false, len: 0, drops: 1},
			{op: "put", key: "k1", at: 1, state: 10, stored: true, len: 1, drops: 0},
			{op: "put", key: "k1", at: 2, state: 200, stored: false, len: 0, drops: 1}, // the old copy goes too
		}},
	}
	c := table(&rule.Rule{Name: "r", Algorithm: bucket.FixedWindow, Limit: 100, Period: time.Hour, Durable: true}).Get("r")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Budget
			fb := &fakeBudget{max: tt.budget}
			if tt.budget > 0 {
				b = fb
			}
			s := NewStore(tt.limit, b)
			for i, st := range tt.steps {
				switch st.op {
				case "put":
					if got := s.Put(copyOf("r", st.key, st.at, st.state)); got != st.stored {
						t.Errorf("step %d: put %s = %v, want %v", i, st.key, got, st.stored)
					}
				case "take":
					cp, ok := s.Take("r", st.key)
					if ok != st.stored || ok && (cp.State.Key != st.key || cp.State.Seq != 7) {
						t.Errorf("step %d: take %s = %+v %v", i, st.key, cp, ok)
					}
				case "permits":
					if got := s.DroppedPermits(c, st.at); got != st.permit {
						t.Errorf("step %d: dropped permits %d, want %d", i, got, st.permit)
					}
				}
				if s.Len() != st.len || s.Dropped() != st.drops {
					t.Errorf("step %d (%s): %d copies, %d dropped; want %d, %d", i, st.op, s.Len(), s.Dropped(), st.len, st.drops)
				}
				if s.Bytes() > tt.limit || tt.budget > 0 && fb.used != s.Bytes() {
					t.Errorf("step %d: %d bytes (limit %d), budget counts %d", i, s.Bytes(), tt.limit, fb.used)
				}
			}
			s.Range(func(Copy) bool { return false })
			if s.Bytes() != 0 || s.Len() != 0 || fb.used != 0 {
				t.Errorf("empty store holds %d bytes, %d copies; budget %d", s.Bytes(), s.Len(), fb.used)
			}
		})
	}
}

// TestStoreRoundTrip: a copy comes back from the Store as it went in,
// whatever parts it has.
func TestStoreRoundTrip(t *testing.T) {
	for _, st := range []shard.BucketState{
		{Rule: "r", Key: "a", Generation: 3, Seq: 9, First: 2, PenaltyLeft: 5, RefillFloor: -4, State: []byte{1, 2, 3}},
		{Rule: "r", Key: "b", Generation: 3, State: make([]byte, stateInline+1),
			Refilled: []shard.RefilledGrant{{Nonce: 4, ExpiresIn: 8}}, Inline: &rule.InlineLimit{Limit: 5, Period: time.Second}},
	} {
		s := NewStore(0, nil)
		s.Put(Copy{State: st, At: 11})
		got, ok := s.Take(st.Rule, st.Key)
		same := fmt.Sprint(got.State.Inline == nil) == fmt.Sprint(st.Inline == nil) && (st.Inline == nil || *got.State.Inline == *st.Inline)
		got.State.Inline, st.Inline = nil, nil
		if !ok || !same || fmt.Sprint(got.State) != fmt.Sprint(st) || got.At != 11 || s.Bytes() != 0 {
			t.Errorf("round trip of %+v: %+v %v, %d bytes left", st, got, ok, s.Bytes())
		}
	}
}

// TestStoreCountsAgainstBucketBudget: a Replicator's copies take at most
// CopyShare of the node's bucket memory budget, and the bucket map counts
// them.
func TestStoreCountsAgainstBucketBudget(t *testing.T) {
	m := shard.New(shard.Config{MaxBytes: 1 << 20})
	r := New(Local{ID: "a", Buckets: m})
	if want := int64(1<<20) / 100 * CopyShare; r.Store.MaxBytes() != want {
		t.Fatalf("limit %d, want %d", r.Store.MaxBytes(), want)
	}
	stored := 0
	for i := range 10000 {
		if r.Store.Put(copyOf("r", fmt.Sprint("key-", i), 1, 12)) {
			stored++
		}
	}
	if stored == 10000 || r.Store.Dropped() != int64(10000-stored) {
		t.Fatalf("stored %d of 10000, %d dropped", stored, r.Store.Dropped())
	}
	if m.Bytes() != r.Store.Bytes() || r.Store.Bytes() > r.Store.MaxBytes() {
		t.Errorf("bucket map counts %d bytes, the store %d (limit %d)", m.Bytes(), r.Store.Bytes(), r.Store.MaxBytes())
	}
}

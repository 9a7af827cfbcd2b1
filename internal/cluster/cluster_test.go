package cluster

import (
	"fmt"
	"math"
	"testing"
)

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("node-%d", i), GRPCAddr: fmt.Sprintf("127.0.0.1:%d", 7070+i)}
	}
	return ms
}

func owners(v *View, keys int) []string {
	out := make([]string, keys)
	for i := range out {
		m, _ := v.Owner(fmt.Sprintf("user-%d", i))
		out[i] = m.ID
	}
	return out
}

// TestGolden pins the hash: servers and clients of every version must agree
// on owners, so a change here is a breaking change.
func TestGolden(t *testing.T) {
	v := NewView(1, members(3))
	got := fmt.Sprint(owners(v, 8))
	want := fmt.Sprint(goldenOwners)
	if got != want {
		t.Fatalf("owners of user-0..7 over node-0..2 = %s, want %s (the ownership hash changed)", got, want)
	}
	if KeyHash("alice") != 0x508b2abb65a03907 {
		t.Fatalf("KeyHash(alice) = %#x", KeyHash("alice"))
	}
}

var goldenOwners = []string{"node-0", "node-0", "node-0", "node-2", "node-0", "node-1", "node-2", "node-0"}

func TestBalance(t *testing.T) {
	const keys = 100_000
	for _, n := range []int{2, 3, 5, 8} {
		counts := map[string]int{}
		for _, o := range owners(NewView(1, members(n)), keys) {
			counts[o]++
		}
		want := float64(keys) / float64(n)
		for id, c := range counts {
			if math.Abs(float64(c)-want)/want > 0.05 {
				t.Errorf("n=%d: %s owns %d keys, want %.0f ± 5%%", n, id, c, want)
			}
		}
	}
}

// TestMinimalMovement: adding a member moves about 1/N of the keys, all to
// the new member; removing one moves only its keys.
func TestMinimalMovement(t *testing.T) {
	const keys = 100_000
	for _, n := range []int{2, 3, 4, 7} {
		before := owners(NewView(1, members(n)), keys)
		after := owners(NewView(2, members(n+1)), keys)
		newID := fmt.Sprintf("node-%d", n)
		moved := 0
		for i := range before {
			if before[i] != after[i] {
				moved++
				if after[i] != newID {
					t.Fatalf("n=%d: key %d moved from %s to %s, not to the new member", n, i, before[i], after[i])
				}
			}
		}
		frac, want := float64(moved)/keys, 1/float64(n+1)
		if math.Abs(frac-want) > 0.02 {
			t.Errorf("n=%d→%d: %.3f of the keys moved, want about %.3f", n, n+1, frac, want)
		}
		// Removing node-0 moves only node-0's keys.
		removed := owners(NewView(3, members(n + 1)[1:]), keys)
		for i := range after {
			if after[i] != "node-0" && removed[i] != after[i] {
				t.Fatalf("n=%d: removing node-0 moved key %d from %s", n, i, after[i])
			}
		}
	}
}

func TestViewBasics(t *testing.T) {
	var empty *View
	if _, ok := empty.Owner("k"); ok || empty.Len() != 0 {
		t.Fatal("an empty view has an owner")
	}
	ms := members(3)
	v := NewView(7, []Member{ms[2], ms[0], ms[1], ms[0]})
	if v.Len() != 3 || v.Members()[0].ID != "node-0" {
		t.Fatalf("members not sorted and deduplicated: %v", v.Members())
	}
	if !v.Equal(NewView(8, ms)) {
		t.Fatal("views with the same members are not Equal")
	}
	if v.Equal(NewView(8, ms[:2])) {
		t.Fatal("views with different members are Equal")
	}
	m, ok := v.Member("node-1")
	if !ok || m.GRPCAddr != "127.0.0.1:7071" {
		t.Fatalf("Member(node-1) = %v %v", m, ok)
	}
	h := KeyHash("bob")
	a, _ := v.Owner("bob")
	b, _ := v.OwnerOfHash(h)
	if a != b {
		t.Fatal("Owner and OwnerOfHash disagree")
	}
}

func BenchmarkOwner(b *testing.B) {
	v := NewView(1, members(5))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		v.Owner("user-123456")
	}
}

// The next owner in rendezvous order, skipping members believed down, is
// the owner the view gives once those members leave it: a key moved by a
// client or a server while its owner is down moves once.
func TestOwnerExceptIsTheViewWithoutTheSkipped(t *testing.T) {
	ms := members(5)
	v := NewView(1, ms)
	for i := 0; i < 2000; i++ {
		key := fmt.Sprint("key-", i)
		h := KeyHash(key)
		own, _ := v.Owner(key)
		if got, ok := v.OwnerExcept(h, nil); !ok || got != own {
			t.Fatalf("key %s: OwnerExcept(nil) = %v, Owner = %v", key, got, own)
		}
		down := map[string]bool{own.ID: true, ms[i%5].ID: true}
		var rest []Member
		for _, m := range ms {
			if !down[m.ID] {
				rest = append(rest, m)
			}
		}
		want, _ := NewView(2, rest).Owner(key)
		if got, ok := v.OwnerExcept(h, func(id string) bool { return down[id] }); !ok || got != want {
			t.Fatalf("key %s with %v down: next owner %v, the view without them says %v", key, down, got, want)
		}
	}
	if _, ok := v.OwnerExcept(1, func(string) bool { return true }); ok {
		t.Fatal("every member skipped: want no owner")
	}
	if _, ok := (*View)(nil).OwnerExcept(1, nil); ok {
		t.Fatal("nil view: want no owner")
	}
}

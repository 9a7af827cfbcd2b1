package server

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/cluster"
)

// movingView is a Standalone whose routing view the test sets; it never
// signals a change, so the test drives observeView itself.
type movingView struct {
	*Standalone
	view atomic.Pointer[cluster.View]
}

func (m *movingView) View() *cluster.View { return m.view.Load() }

// Regression (the handoff tests: a key admitted 110 of 100 a day, a
// concurrency key holding 4 leases of 3, a release of a lease on its way
// answered with "nothing of it here"): observeView marked a view as seen
// before it had expected the handoffs that view makes. A decision that
// loaded the new view in that window found it seen, found no handoff of
// its key pending, and decided it on a fresh bucket (or settled a grant
// on none) while the key's state was still on its way from its old
// owner. A trace caught it 125 µs wide on a node joining a cluster. A
// decision must wait until the view's moves are expected.
func TestDecisionWaitsUntilTheViewsMovesAreExpected(t *testing.T) {
	self := cluster.Member{ID: "node-1", GRPCAddr: "bufnet"}
	other := cluster.Member{ID: "other", GRPCAddr: "127.0.0.1:1"}
	before := cluster.NewView(1, []cluster.Member{other})      // this node joining: not in it yet
	after := cluster.NewView(2, []cluster.Member{self, other}) // it is in: keys come from other
	var mv *movingView
	tn := newTestNodeWith(t, func(s *Standalone) DataPlane {
		mv = &movingView{Standalone: s}
		mv.view.Store(before)
		return mv
	})
	n := tn.node
	tn.put(t, tokenBucket("r", 10))
	n.observeView(before)
	key := keyOf(t, after, self.ID)

	entered, release := make(chan struct{}), make(chan struct{})
	n.seen.handling = func() {
		close(entered)
		<-release
	}
	mv.view.Store(after)
	handled := make(chan struct{})
	go func() { // the node's own watcher, caught while handling the view
		defer close(handled)
		n.observeView(after)
	}()
	<-entered
	type answer struct {
		m  cluster.Member
		ok bool
	}
	got := make(chan answer, 1)
	go func() { // an acquire or a settlement that loads the new view meanwhile
		m, ok, _ := n.stateElsewhere("r", key)
		got <- answer{m, ok}
	}()
	var a answer
	select {
	case a = <-got: // answered while the view was being handled: the bug
		close(release)
	case <-time.After(200 * time.Millisecond): // waiting, as it should
		close(release)
		a = <-got
	}
	<-handled
	if !a.ok || a.m.ID != other.ID {
		t.Fatalf("key %q, which the view gives this node: state elsewhere = (%q, %v), want the handoff from %s expected", key, a.m.ID, a.ok, other.ID)
	}
}

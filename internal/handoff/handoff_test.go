package handoff

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// node is one in-process receiver with its own clock and buckets.
type node struct {
	l    Local
	r    *Receiver
	srv  *grpc.Server
	addr string
}

func newNode(t testing.TB, id string, tbl func() *rule.Table, clock int64, peer bool) *node {
	t.Helper()
	n := &node{l: Local{ID: id, Buckets: shard.New(shard.Config{}), Table: tbl, Now: func() int64 { return clock }}}
	n.r = NewReceiver(n.l, func(context.Context) bool { return peer }, func() *cluster.View { return nil })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = lis.Addr().String()
	n.srv = grpc.NewServer()
	peerv1.RegisterHandoffServiceServer(n.srv, n.r)
	go n.srv.Serve(lis)
	t.Cleanup(n.srv.Stop)
	return n
}

func dial(t testing.TB) func(string) (grpc.ClientConnInterface, error) {
	return func(addr string) (grpc.ClientConnInterface, error) {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
}

func rules(t testing.TB) (func() *rule.Table, *rule.Compiled) {
	s, err := raftfsm.NewInmem("handoff-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Put(context.Background(), &rule.Rule{Name: "q", Algorithm: bucket.FixedWindow, Limit: 100, Period: 24 * time.Hour}, nil); err != nil {
		t.Fatal(err)
	}
	return s.Table, s.Table().Get("q")
}

// use takes n permits of key on nd, one at a time, and returns how many
// were admitted.
func use(t *testing.T, nd *node, c *rule.Compiled, key string, n int) int {
	got := 0
	for i := 0; i < n; i++ {
		d, err := nd.l.Buckets.Acquire(c, key, bucket.Request{Permits: 1}, nd.l.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			got++
		}
	}
	return got
}

func to(m *node) func(string, string) (cluster.Member, bool) {
	return func(string, string) (cluster.Member, bool) { return cluster.Member{ID: m.l.ID, GRPCAddr: m.addr}, true }
}

// TestHandoffTwoMovesInARow moves a used-up key twice: it stays used up.
func TestHandoffTwoMovesInARow(t *testing.T) {
	tbl, c := rules(t)
	a, b, z := newNode(t, "a", tbl, 9e14, true), newNode(t, "b", tbl, 2e12, true), newNode(t, "z", tbl, 5e16, true)
	admitted := use(t, a, c, "k", 90)
	if _, _, err := Send(context.Background(), a.l, to(b), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	admitted += use(t, b, c, "k", 5)
	if _, _, err := Send(context.Background(), b.l, to(z), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	admitted += use(t, z, c, "k", 50)
	if admitted != 100 {
		t.Fatalf("admitted %d across two moves, want exactly the limit 100", admitted)
	}
}

// TestHandoffNewOwnerDies stops the new owner before the handoff: the
// sender retries to the owner the view gives next, and the key never
// starts fresh there.
func TestHandoffNewOwnerDies(t *testing.T) {
	tbl, c := rules(t)
	a, b, z := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, true), newNode(t, "z", tbl, 1e13, true)
	admitted := use(t, a, c, "k", 100)
	b.srv.Stop() // dies
	var tries atomic.Int64
	moved := func(r, k string) (cluster.Member, bool) {
		if tries.Load() < 2 { // the view still names b at first
			tries.Add(1)
			return to(b)(r, k)
		}
		return to(z)(r, k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := Send(ctx, a.l, moved, dial(t), 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := use(t, z, c, "k", 10); got != 0 {
		t.Fatalf("a used-up key admitted %d on the owner after the dead one (admitted %d before)", got, admitted)
	}
}

// TestHandoffStreamCut cuts a transfer after its first batch: the
// receiver keeps holding the sender's keys (no last batch), the sender's
// retry installs again without double counting.
func TestHandoffStreamCut(t *testing.T) {
	tbl, c := rules(t)
	a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, true)
	for i := 0; i < 2*BatchBuckets; i++ {
		use(t, a, c, "k"+string(rune('A'+i%26))+string(rune('a'+i/26)), 100)
	}
	old := cluster.NewView(1, []cluster.Member{{ID: "a"}})
	b.r.Expect("a", old, time.Minute)
	// The cut: one batch, no last, stream closed.
	conn, _ := dial(t)(b.addr)
	st, err := peerv1.NewHandoffServiceClient(conn).Transfer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var first []*peerv1.BucketState
	_ = a.l.Buckets.Export(a.l.Now(), func(string, string) bool { return true }, func(s shard.BucketState) error {
		if len(first) < BatchBuckets {
			first = append(first, ToPB(s))
		}
		return nil
	})
	issuers, _ := issuersPB(a.l.Buckets.Issuers())
	if err := st.Send(&peerv1.HandoffBatch{From: "a", SenderNowNs: a.l.Now(), Issuers: issuers, Buckets: first}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if b.r.npending.Load() != 1 {
		t.Fatal("a cut stream ended the hold on the sender's keys")
	}
	if _, _, err := Send(context.Background(), a.l, to(b), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if b.r.npending.Load() != 0 {
		t.Fatal("the full transfer did not end the hold")
	}
	if got := use(t, b, c, "kAa", 10); got != 0 {
		t.Fatalf("a used-up key admitted %d after a cut and a retry", got)
	}
}

// TestHandoffComesBackDuringDrain hands a key to b while a drains, then
// back to a (it came back) where a's own, older copy is still held: the
// key stays used up.
func TestHandoffComesBackDuringDrain(t *testing.T) {
	tbl, c := rules(t)
	a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, true)
	admitted := use(t, a, c, "k", 60)
	if _, _, err := Send(context.Background(), a.l, to(b), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	admitted += use(t, b, c, "k", 30)
	if _, _, err := Send(context.Background(), b.l, to(a), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	admitted += use(t, a, c, "k", 50)
	if admitted != 100 {
		t.Fatalf("admitted %d, want the limit 100", admitted)
	}
}

// TestHandoffRefusesNonPeers: a transfer or a prepare from a caller that
// is not a peer is refused and installs nothing.
func TestHandoffRefusesNonPeers(t *testing.T) {
	tbl, c := rules(t)
	a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, false)
	use(t, a, c, "k", 100)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _, err := Send(ctx, a.l, to(b), dial(t), 100*time.Millisecond)
	if err == nil {
		t.Fatalf("transfer from a non-peer: %v", err)
	}
	if b.l.Buckets.Has("q", "k") {
		t.Fatal("a non-peer's bucket was installed")
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	if err := Prepare(pctx, a.l, cluster.Member{ID: "b", GRPCAddr: b.addr}, dial(t), time.Second); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("prepare from a non-peer: %v, want PermissionDenied", err)
	}
}

// TestHandoffStreamCutKeepsKeysInFlight cuts a transfer after its first
// batch: the keys of that batch are installed, the others stay in flight
// (InFlight names the sender, and a wait for them ends without a fresh
// bucket) until the sender's retry installs them, used up.
func TestHandoffStreamCutKeepsKeysInFlight(t *testing.T) {
	tbl, c := rules(t)
	a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, true)
	keys := make([]string, 2*BatchBuckets)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		use(t, a, c, keys[i], 100)
	}
	b.r.Expect("a", cluster.NewView(1, []cluster.Member{{ID: "a", GRPCAddr: a.addr}}), time.Minute)
	var states []*peerv1.BucketState
	if err := a.l.Buckets.HandOver(a.l.Now(), func(string, string) bool { return true }, func(s shard.BucketState) error {
		states = append(states, ToPB(s))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	conn, _ := dial(t)(b.addr)
	st, err := peerv1.NewHandoffServiceClient(conn).Transfer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	issuers, _ := issuersPB(a.l.Buckets.Issuers())
	if err := st.Send(&peerv1.HandoffBatch{From: "a", SenderNowNs: a.l.Now(), Issuers: issuers, Buckets: states[:BatchBuckets]}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil { // the cut: no last batch
		t.Fatal(err)
	}
	installed, missing := states[0].GetKey(), states[len(states)-1].GetKey()
	if _, ok := b.r.InFlight("q", installed); ok {
		t.Fatalf("key %s was installed, yet reported in flight", installed)
	}
	if m, ok := b.r.InFlight("q", missing); !ok || m.ID != "a" {
		t.Fatalf("key %s of the cut part: InFlight = %v, %v; want a, true", missing, m, ok)
	}
	if b.r.WaitKey(context.Background(), "q", missing, time.Now().Add(20*time.Millisecond), true) {
		t.Fatal("a wait for a key handed over but cut off ended as if it could be decided here")
	}
	// The sender's retry (the whole stream again).
	retry := &peerv1.HandoffBatch{From: "a", SenderNowNs: a.l.Now(), Issuers: issuers, Buckets: states, Last: true}
	st, err = peerv1.NewHandoffServiceClient(conn).Transfer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(retry); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if !b.r.WaitKey(context.Background(), "q", missing, time.Now().Add(time.Second), true) {
		t.Fatal("the retried transfer did not install the key")
	}
	for _, k := range []string{installed, missing} {
		if got := use(t, b, c, k, 10); got != 0 {
			t.Fatalf("used-up key %s admitted %d after a cut and a retry", k, got)
		}
	}
}

// TestHandoffNewOwnerDiesKeyComesBack: the new owner dies during the
// handoff and the view gives the key back to the sender: the sender goes
// on from the state it froze (used up), never from a fresh bucket, and
// decides again.
func TestHandoffNewOwnerDiesKeyComesBack(t *testing.T) {
	tbl, c := rules(t)
	a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, true)
	use(t, a, c, "k", 95)
	b.srv.Stop() // dies
	var tries atomic.Int64
	moved := func(r, k string) (cluster.Member, bool) {
		if tries.Add(1) <= 2 { // the export's filter and the first attempt
			return to(b)(r, k)
		}
		return cluster.Member{ID: "a", GRPCAddr: a.addr}, true // b left the view: the key is a's again
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := Send(ctx, a.l, moved, dial(t), 10*time.Millisecond); err != nil {
		t.Fatalf("Send: %v (the key came back: nothing left to send)", err)
	}
	if got := use(t, a, c, "k", 10); got != 5 {
		t.Fatalf("after the key came back, a admitted %d, want the 5 left of its frozen state", got)
	}
}

// TestWaitKeyHandedOverElsewhere: the old owner said it handed the key
// over, and the handoff this node waited for ends without it (the key
// went to another node): the wait ends false, never in a fresh bucket
// (at the end of the handoff, or at its own bound if it began after).
func TestWaitKeyHandedOverElsewhere(t *testing.T) {
	tbl, _ := rules(t)
	a, b := newNode(t, "a", tbl, 1e15, true), newNode(t, "b", tbl, 1e12, true)
	b.r.Expect("a", cluster.NewView(1, []cluster.Member{{ID: "a", GRPCAddr: a.addr}}), time.Minute)
	done := make(chan bool)
	go func() { done <- b.r.WaitKey(context.Background(), "q", "k", time.Now().Add(2*time.Second), true) }()
	// a hands b nothing: an empty last batch ends its handoff.
	if _, _, err := Send(context.Background(), a.l, func(string, string) (cluster.Member, bool) { return cluster.Member{}, false },
		dial(t), time.Millisecond, cluster.Member{ID: "b", GRPCAddr: b.addr}); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-done:
		if ok {
			t.Fatal("the wait ended as if the key could start fresh here")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the end of the handoff did not end the wait")
	}
	if b.r.npending.Load() != 0 {
		t.Fatal("the empty last batch did not end the handoff")
	}
}

package raftfsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// TestIssue20Item18_RetriedWriteAnswersItsFirstResult checks that a rule
// write retried with its request id (after an UNAVAILABLE answer for a
// write that in fact committed) gets the first apply's result rather than
// a compare-and-set failure against its own write, and changes nothing.
func TestIssue20Item18_RetriedWriteAnswersItsFirstResult(t *testing.T) {
	put := func(r *rule.Rule, expected *uint64, id string) *raftv1.PutRule {
		e := putEntry(r, expected, 0)
		e.RequestId = id
		return e
	}
	f := NewFSM()
	first := applyAt(t, f, 3, entryPutRule, put(tbRule("api", 10), u64(0), "req-1"))
	if first.err != nil {
		t.Fatal(first.err)
	}
	steps := []struct {
		name    string
		index   uint64
		typ     byte
		entry   func() proto.Message
		wantErr error
		check   func(t *testing.T, res applyResult)
	}{
		{"retried put answers the stored rule", 4, entryPutRule, func() proto.Message { return put(tbRule("api", 10), u64(0), "req-1") }, nil,
			func(t *testing.T, res applyResult) {
				if res.rule == nil || res.rule.Version != 3 || res.rule.Generation != 3 || res.rule.Limit != 10 {
					t.Fatalf("retry answered %+v, want version 3", res.rule)
				}
			}},
		{"same put without the id is a stale compare-and-set", 5, entryPutRule, func() proto.Message { return put(tbRule("api", 10), u64(0), "") }, rule.ErrVersionMismatch, nil},
		{"a failed write's retry fails alike", 6, entryPutRule, func() proto.Message { return put(tbRule("api", 11), u64(99), "req-2") }, rule.ErrVersionMismatch, nil},
		{"its retry, the version now right, still answers the first result", 7, entryPutRule, func() proto.Message { return put(tbRule("api", 11), u64(3), "req-2") }, rule.ErrVersionMismatch, nil},
		{"delete", 8, entryDeleteRule, func() proto.Message {
			return &raftv1.DeleteRule{Name: "api", ExpectedVersion: u64(3), RequestId: "req-3"}
		}, nil, nil},
		{"retried delete succeeds again", 9, entryDeleteRule, func() proto.Message {
			return &raftv1.DeleteRule{Name: "api", ExpectedVersion: u64(3), RequestId: "req-3"}
		}, nil, nil},
		{"a delete without the id finds nothing", 10, entryDeleteRule, func() proto.Message { return &raftv1.DeleteRule{Name: "api"} }, rule.ErrNotFound, nil},
	}
	for _, s := range steps {
		res := applyAt(t, f, s.index, s.typ, s.entry())
		if !errors.Is(res.err, s.wantErr) || (s.wantErr == nil && res.err != nil) {
			t.Fatalf("%s: error %v, want %v", s.name, res.err, s.wantErr)
		}
		if s.check != nil {
			s.check(t, res)
		}
	}
	if f.Table().Get("api") != nil {
		t.Fatal("the retries changed the table")
	}

	// The ids survive a snapshot: a restored replica answers alike.
	g := NewFSM()
	if err := g.Restore(snapshotOf(t, f)); err != nil {
		t.Fatal(err)
	}
	if res := applyAt(t, g, 11, entryPutRule, put(tbRule("api", 10), u64(0), "req-1")); res.err != nil || res.rule.Version != 3 {
		t.Fatalf("retry after restore: %+v", res)
	}
	if g.Table().Get("api") != nil {
		t.Fatal("a retry after restore put the rule again")
	}
}

// TestIssue20Item18_RequestLogIsBounded checks that the FSM forgets the
// oldest request ids past maxRequests.
func TestIssue20Item18_RequestLogIsBounded(t *testing.T) {
	l := newRequestLog()
	for i := range maxRequests + 10 {
		l.add(requestRecord{ID: fmt.Sprint(i), Index: uint64(i)})
	}
	if l.len() != maxRequests {
		t.Fatalf("%d ids remembered, want %d", l.len(), maxRequests)
	}
	if _, ok := l.get("0"); ok {
		t.Fatal("the oldest id was kept")
	}
	if _, ok := l.get(fmt.Sprint(maxRequests + 9)); !ok {
		t.Fatal("the newest id was forgotten")
	}
	m, err := requestLogFromPB(l.toPB())
	if err != nil || m.len() != maxRequests || m.order[0] != "10" {
		t.Fatalf("round trip: %v, %d ids", err, m.len())
	}
}

// TestIssue20Item18_NodeRequestID checks the request id through a node:
// a retried put answers the first result, an overlong id is refused.
func TestIssue20Item18_NodeRequestID(t *testing.T) {
	n := inmem(t, 0)
	ctx := context.Background()
	r1, err := n.PutRequest(ctx, "abc", tbRule("x", 5), u64(0))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := n.PutRequest(ctx, "abc", tbRule("x", 5), u64(0))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if r2.Version != r1.Version {
		t.Fatalf("retry: version %d, want %d", r2.Version, r1.Version)
	}
	if err := n.DeleteRequest(ctx, "del", "x", &r1.Version); err != nil {
		t.Fatal(err)
	}
	if err := n.DeleteRequest(ctx, "del", "x", &r1.Version); err != nil {
		t.Fatalf("retried delete: %v", err)
	}
	if _, err := n.PutRequest(ctx, strings.Repeat("a", MaxRequestIDLen+1), tbRule("y", 5), nil); !errors.Is(err, rule.ErrInvalid) {
		t.Fatalf("overlong request id: %v", err)
	}
}

// TestIssue20Item5_RuleTableByteCap checks the cap on the rule table's
// total bytes: carried in the entry (the FSM applies the entry's cap,
// whatever its own configuration), refused with a clear error at the
// edge, and a put that does not grow the table still passes.
func TestIssue20Item5_RuleTableByteCap(t *testing.T) {
	big := func(name string, keys int) *rule.Rule {
		r := tbRule(name, 10)
		for i := range keys {
			r.Deny = append(r.Deny, fmt.Sprintf("%s-deny-%06d", name, i))
		}
		return r
	}
	size := ruleBytes(big("a", 100))
	capBytes := 2*size + size/2 // room for two such rules
	put := func(r *rule.Rule, limit int64) *raftv1.PutRule {
		e := putEntry(r, nil, 0)
		e.MaxTableBytes = limit
		return e
	}
	f := NewFSM()
	for i, tc := range []struct {
		name    string
		r       *rule.Rule
		max     int64
		wantErr error
	}{
		{"first", big("a", 100), capBytes, nil},
		{"second", big("b", 100), capBytes, nil},
		{"third passes the cap", big("c", 100), capBytes, ErrRuleTableFull},
		{"an entry without a cap (older leader) applies", big("c", 100), 0, nil},
		{"growing a rule of a full table", big("a", 200), capBytes, ErrRuleTableFull},
		{"shrinking a rule of a table over the cap", big("a", 10), capBytes, nil},
	} {
		res := applyAt(t, f, uint64(i+1), entryPutRule, put(tc.r, tc.max))
		if !errors.Is(res.err, tc.wantErr) || (tc.wantErr == nil && res.err != nil) {
			t.Fatalf("%s: %v, want %v", tc.name, res.err, tc.wantErr)
		}
		if tc.wantErr != nil && (!errors.Is(res.err, rule.ErrTooManyRules) || !strings.Contains(res.err.Error(), "--max-rule-table-bytes")) {
			t.Fatalf("%s: the error %q does not say which limit", tc.name, res.err)
		}
	}
	want := ruleBytes(big("a", 10)) + ruleBytes(big("b", 100)) + ruleBytes(big("c", 100))
	if got := f.state.Load().RuleBytes; got != want {
		t.Fatalf("table bytes %d, want %d", got, want)
	}
	g := NewFSM()
	if err := g.Restore(snapshotOf(t, f)); err != nil {
		t.Fatal(err)
	}
	if got := g.state.Load().RuleBytes; got != want {
		t.Fatalf("table bytes after restore %d, want %d", got, want)
	}

	// The edge: a node refuses before proposing.
	n := inmem(t, 0)
	n.cfg.MaxRuleTableBytes = capBytes
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if _, err := n.Put(ctx, big(name, 100), nil); err != nil {
			t.Fatal(err)
		}
	}
	before := n.fsm.AppliedIndex()
	if _, err := n.Put(ctx, big("c", 100), nil); !errors.Is(err, ErrRuleTableFull) {
		t.Fatalf("put past the byte cap: %v", err)
	}
	if n.fsm.AppliedIndex() != before {
		t.Fatal("the refused put reached the log")
	}
	if err := n.Delete(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, big("c", 100), nil); err != nil {
		t.Fatalf("put after a delete made room: %v", err)
	}
}

// snapshotOf persists f's state as a snapshot.
func snapshotOf(t *testing.T, f *FSM) io.ReadCloser {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	return io.NopCloser(bytes.NewReader(sink.Bytes()))
}

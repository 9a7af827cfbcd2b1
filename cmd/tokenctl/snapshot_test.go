package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// restoreStub has the rules a, b and c and counts the restores it gets.
type restoreStub struct {
	pb.UnimplementedAdminServiceServer
	restores atomic.Int64
}

func (*restoreStub) ListRules(context.Context, *pb.ListRulesRequest) (*pb.ListRulesResponse, error) {
	return &pb.ListRulesResponse{Rules: []*pb.Rule{{Name: "a"}, {Name: "b"}, {Name: "c"}}}, nil
}

func (s *restoreStub) SnapshotRestore(stream grpc.ClientStreamingServer[pb.SnapshotChunk, pb.SnapshotRestoreResponse]) error {
	for {
		if _, err := stream.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return err
		}
	}
	s.restores.Add(1)
	return stream.SendAndClose(&pb.SnapshotRestoreResponse{Rules: 0, Version: 9})
}

// snapshotOf is a snapshot in the current format holding rules names.
func snapshotOf(t *testing.T, names ...string) string {
	t.Helper()
	m := &raftv1.Snapshot{Index: 3}
	for _, n := range names {
		m.Rules = append(m.Rules, &raftv1.Rule{Name: n})
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return snapshotMagic + string(b)
}

// TestSnapshotRestoreEmptyNeedsForce: a restore that would delete rules
// (an empty snapshot {} deletes them all) is refused with the count unless
// --force; one that deletes none goes through.
func TestSnapshotRestoreEmptyNeedsForce(t *testing.T) {
	stub := &restoreStub{}
	srv := grpc.NewServer()
	pb.RegisterAdminServiceServer(srv, stub)
	addr := serveWith(t, srv)
	tests := []struct {
		name     string
		snapshot string
		force    bool
		want     string // in the error; "" for a restore
	}{
		{"empty JSON snapshot", "{}", false, "would delete 3 of the cluster's 3 rules (a, b, c)"},
		{"empty JSON snapshot, forced", "{}", true, ""},
		{"first-format snapshot lacking one", `{"rules": {"a": {}, "b": {}}}`, false, "would delete 1 of the cluster's 3 rules (c)"},
		{"snapshot lacking two", snapshotOf(t, "a"), false, "would delete 2 of the cluster's 3 rules (b, c)"},
		{"snapshot with every rule", snapshotOf(t, "a", "b", "c", "d"), false, ""},
		{"newer format", "TSS\x07rest", false, "pass --force"},
		{"not a snapshot", "hello", false, "not a tokenserver snapshot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := stub.restores.Load()
			args := []string{"--server", addr, "--timeout", "5s", "snapshot", "restore", "-"}
			if tt.force {
				args = append(args, "--force")
			}
			r := tokenctl(t, tt.snapshot, args...)
			restored := stub.restores.Load() - before
			switch {
			case tt.want == "" && (r.err != nil || restored != 1):
				t.Errorf("restore: %v, %d restores, want one", r.err, restored)
			case tt.want != "" && (r.err == nil || !strings.Contains(r.err.Error(), tt.want) || restored != 0):
				t.Errorf("restore: %v, %d restores; want refused with %q", r.err, restored, tt.want)
			}
		})
	}
}

// TestSnapshotRuleNamesGolden: tokenctl reads the rule names of the
// server's golden snapshots, of both formats, as the server does.
func TestSnapshotRuleNamesGolden(t *testing.T) {
	var want struct {
		Rules []struct {
			Name string `json:"name"`
		} `json:"rules"`
	}
	b, err := os.ReadFile("../../internal/raftfsm/testdata/golden/expected.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"v0.snapshot", "v1.snapshot"} {
		data, err := os.ReadFile(filepath.Join("../../internal/raftfsm/testdata/golden", f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := snapshotRuleNames(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(got) != len(want.Rules) || len(got) == 0 {
			t.Errorf("%s: %d rules, want %d", f, len(got), len(want.Rules))
		}
		for _, r := range want.Rules {
			if !got[r.Name] {
				t.Errorf("%s: rule %q missing from %v", f, r.Name, got)
			}
		}
	}
}

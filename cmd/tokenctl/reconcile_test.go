package main

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// lostAnswerAdmin commits each write and answers its first attempt
// Unavailable, as a leader that loses its answer does; the retry then
// meets its own write. With other set, another writer's rule replaces the
// committed one before the retry.
type lostAnswerAdmin struct {
	pb.UnimplementedAdminServiceServer
	other *pb.Rule

	mu       sync.Mutex
	rules    map[string]*pb.Rule
	version  uint64
	attempts int
}

func (s *lostAnswerAdmin) PutRule(_ context.Context, req *pb.PutRuleRequest) (*pb.PutRuleResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	cur := s.rules[req.GetRule().GetName()]
	if req.ExpectedVersion != nil && cur.GetVersion() != req.GetExpectedVersion() {
		return nil, status.Errorf(codes.FailedPrecondition, "rule %q is at version %d, not %d", req.GetRule().GetName(), cur.GetVersion(), req.GetExpectedVersion())
	}
	s.version++
	r := proto.Clone(req.GetRule()).(*pb.Rule)
	r.Version, r.Generation = s.version, s.version
	s.rules[r.GetName()] = r
	if s.attempts == 1 {
		if s.other != nil {
			o := proto.Clone(s.other).(*pb.Rule)
			s.version++
			o.Version = s.version
			s.rules[o.GetName()] = o
		}
		return nil, status.Error(codes.Unavailable, "leadership lost while committing")
	}
	return &pb.PutRuleResponse{Rule: r}, nil
}

func (s *lostAnswerAdmin) DeleteRule(_ context.Context, req *pb.DeleteRuleRequest) (*pb.DeleteRuleResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	if _, ok := s.rules[req.GetName()]; !ok {
		return nil, status.Errorf(codes.NotFound, "rule %q not found", req.GetName())
	}
	delete(s.rules, req.GetName())
	if s.attempts == 1 {
		return nil, status.Error(codes.Unavailable, "leadership lost while committing")
	}
	return &pb.DeleteRuleResponse{}, nil
}

func (s *lostAnswerAdmin) GetRule(_ context.Context, req *pb.GetRuleRequest) (*pb.Rule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rules[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "rule %q not found", req.GetName())
	}
	return r, nil
}

// TestRetriedWriteCommittedByLostAttempt: a compare-and-set put, or a
// delete, whose first attempt committed but answered Unavailable succeeds
// once tokenctl reads the rule back and finds its own write; a rule
// changed by another writer in between is still a conflict.
func TestRetriedWriteCommittedByLostAttempt(t *testing.T) {
	put := []string{"rule", "put", "api", "--algorithm", "token-bucket", "--limit", "5", "--period", "1s",
		"--deny", "b", "--deny", "a", "--expected-version", "0"}
	tests := []struct {
		name  string
		other *pb.Rule
		rules map[string]*pb.Rule
		args  []string
		want  string // "" for success, else in the error
	}{
		{"put committed by the lost attempt", nil, nil, put, ""},
		{"put overwritten by another writer", &pb.Rule{Name: "api", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 9}, nil, put, "FailedPrecondition"},
		{"delete committed by the lost attempt", nil, map[string]*pb.Rule{"api": {Name: "api", Version: 3}}, []string{"rule", "delete", "api"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stub := &lostAnswerAdmin{other: tt.other, rules: map[string]*pb.Rule{}, version: 5}
			for k, v := range tt.rules {
				stub.rules[k] = v
			}
			srv := grpc.NewServer()
			pb.RegisterAdminServiceServer(srv, stub)
			addr := serveWith(t, srv)
			r := tokenctl(t, "", append([]string{"--server", addr, "--timeout", "5s"}, tt.args...)...)
			switch {
			case tt.want == "" && r.err != nil:
				t.Fatalf("%v, want success", r.err)
			case tt.want == "" && !strings.Contains(r.stderr, "an attempt that answered Unavailable had"):
				t.Errorf("stderr does not say an earlier attempt committed:\n%s", r.stderr)
			case tt.want != "" && (r.err == nil || !strings.Contains(r.err.Error(), tt.want)):
				t.Errorf("%v, want an error with %q", r.err, tt.want)
			}
			if stub.attempts < 2 {
				t.Errorf("%d attempts, want the Unavailable one retried", stub.attempts)
			}
		})
	}
}

// idAdmin answers the first attempt of every write Unavailable and
// records the request id of each attempt, in order.
type idAdmin struct {
	pb.UnimplementedAdminServiceServer
	mu   sync.Mutex
	seen map[string]int // request id → attempts
	ids  []string       // in order of first sight
}

func (s *idAdmin) attempt(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[id] == 0 {
		s.ids = append(s.ids, id)
	}
	s.seen[id]++
	if s.seen[id] == 1 {
		return status.Error(codes.Unavailable, "leadership lost while committing")
	}
	return nil
}

func (s *idAdmin) PutRule(_ context.Context, req *pb.PutRuleRequest) (*pb.PutRuleResponse, error) {
	if err := s.attempt(req.GetRequestId()); err != nil {
		return nil, err
	}
	return &pb.PutRuleResponse{Rule: req.GetRule()}, nil
}

func (s *idAdmin) DeleteRule(_ context.Context, req *pb.DeleteRuleRequest) (*pb.DeleteRuleResponse, error) {
	if err := s.attempt(req.GetRequestId()); err != nil {
		return nil, err
	}
	return &pb.DeleteRuleResponse{}, nil
}

// TestRuleWritesSendRequestID: rule put, rule apply (each rule) and rule
// delete send a random UUID-form request id, the same on every retry of
// one write and different between writes.
func TestRuleWritesSendRequestID(t *testing.T) {
	stub := &idAdmin{seen: map[string]int{}}
	srv := grpc.NewServer()
	pb.RegisterAdminServiceServer(srv, stub)
	addr := serveWith(t, srv)
	rules := writeFile(t, "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n---\nname: b\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n")
	for _, args := range [][]string{
		{"rule", "put", "api", "--algorithm", "token-bucket", "--limit", "1", "--period", "1s"},
		{"rule", "put", "api", "--algorithm", "token-bucket", "--limit", "1", "--period", "1s", "--expected-version", "3"},
		{"rule", "apply", "-f", rules},
		{"rule", "delete", "api"},
	} {
		if r := tokenctl(t, "", append([]string{"--server", addr, "--timeout", "5s"}, args...)...); r.err != nil {
			t.Fatalf("%v: %v", args, r.err)
		}
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if len(stub.ids) != 5 {
		t.Fatalf("%d distinct request ids, want 5 (2 puts, 2 applied rules, 1 delete): %v", len(stub.ids), stub.ids)
	}
	for _, id := range stub.ids {
		if !uuid.MatchString(id) {
			t.Errorf("request id %q is not a version-4 UUID", id)
		}
		if n := stub.seen[id]; n != 2 {
			t.Errorf("request id %s seen on %d attempts, want 2 (the retry keeps the id)", id, n)
		}
	}
}

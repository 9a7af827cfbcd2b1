package server

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestCommitToken: reserve, commit more than reserved (debt), a retry
// that changes nothing, and the refusals of bad input and late commits.
func TestCommitToken(t *testing.T) {
	tn := newTestNode(t, nil)
	c := ctx(t)
	if _, err := tn.admin.PutRule(c, &pb.PutRuleRequest{Rule: &pb.Rule{Name: "llm", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 100,
		Period: durationpb.New(10 * time.Second), ReservationTtl: durationpb.New(5 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	permits := int64(50)
	a, err := tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "llm", Key: "t1", Permits: &permits})
	if err != nil || !a.GetAllowed() {
		t.Fatalf("acquire: %v %v", a, err)
	}
	commit := func(key, id string, used int64) (*pb.CommitTokenResponse, error) {
		return tn.token.CommitToken(c, &pb.CommitTokenRequest{Rule: "llm", Key: key, GrantId: id, Used: used})
	}
	r, err := commit("t1", a.GetGrantId(), 130)
	if err != nil || r.GetDebt() != 30 || r.GetRemaining() != 0 || r.GetRetryAfterNs() <= 0 {
		t.Fatalf("commit 130 of 50 = %v, %v; want debt 30 with a retry_after", r, err)
	}
	if r2, err := commit("t1", a.GetGrantId(), 0); err != nil || r2.GetDebt() != 30 {
		t.Fatalf("retried commit = %v, %v; want no change (debt 30)", r2, err)
	}
	for _, tc := range []struct {
		name string
		key  string
		id   string
		used int64
		want codes.Code
	}{
		{"negative used", "t1", a.GetGrantId(), -1, codes.InvalidArgument},
		{"empty grant", "t1", "", 1, codes.InvalidArgument},
		{"other key", "t2", a.GetGrantId(), 1, codes.NotFound},
	} {
		if _, err := commit(tc.key, tc.id, tc.used); status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	tn.advance(4 * time.Second) // debt 30 repaid at 10/s in 3 s
	b, err := tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "llm", Key: "t1", Permits: &permits})
	if err != nil || b.GetAllowed() {
		t.Fatalf("acquire 50 with 10 back: %v %v; want denied", b, err)
	}
	one := int64(5)
	b, err = tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "llm", Key: "t1", Permits: &one})
	if err != nil || !b.GetAllowed() {
		t.Fatalf("acquire 5: %v %v", b, err)
	}
	tn.advance(5 * time.Second)
	_, err = commit("t1", b.GetGrantId(), 0)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("commit after the reservation TTL: %v, want NotFound", err)
	}
}

package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/shard"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// handoffReason is the ErrorInfo reason of an old owner's answer, "" if
// err is not one.
func handoffReason(err error) string {
	st, _ := status.FromError(err)
	if st.Code() != codes.Aborted {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// Regression (the handoff tests' SDK lease load: a key holding 4 leases
// of 3, and a released lease still held): a key's new owner, not yet in
// its own view after a restart, asked the old owner about the key's state
// (HandoffHeader) on a call whose AvoidHeader named the owner in the old
// owner's view (an SDK names a member that left its view recently: here
// the new owner itself). The old owner's routing refused it ("the key's
// owner answers its health check ... retry"), the new owner took that as
// an old owner that could not be reached and, expecting no handoff,
// decided the key on a fresh bucket, and answered a release of a lease
// still on its way with "nothing of it here". A new owner's question is
// now always answered by the node asked: the state it holds, or that it
// handed the bucket over, or that it holds nothing.
func TestNewOwnerQuestionAnsweredWhateverTheAvoidHeader(t *testing.T) {
	c := testcluster.New(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Leader().Admin().PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{
		Name: "cq", Algorithm: pb.Algorithm_CONCURRENCY, Limit: 3, Period: durationpb.New(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	c.WaitForRule("cq")
	c.WaitFor("views agree", func() bool { return c.ViewsAgree(2) })
	a, b := c.Nodes[0], c.Nodes[1]
	key := c.KeyOwnedBy(b.ID, "q")
	// a decides a lease of b's key (a call forwarded by the view a holds
	// is answered where it lands) and holds its bucket, as an old owner
	// does.
	fwd := metadata.AppendToOutgoingContext(ctx, server.ForwardedHeader, strconv.FormatUint(c.View().Epoch, 10))
	lease, err := a.Token().AcquireToken(fwd, &pb.AcquireTokenRequest{Rule: "cq", Key: key})
	if err != nil || !lease.GetAllowed() {
		t.Fatalf("lease on a: %v %v", lease, err)
	}
	// The new owner's question, naming b (the owner in a's view) as a
	// member to avoid.
	ask := metadata.AppendToOutgoingContext(ctx, server.ForwardedHeader, "1", server.HandoffHeader, "1", server.AvoidHeader, b.ID)

	for _, tc := range []struct {
		name   string
		frozen bool
		want   string // "" for a decision by a's bucket
	}{
		{"bucket held", false, ""},
		{"bucket handed over", true, server.HandedOverReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.frozen {
				if err := a.Buckets().HandOver(time.Now().UnixNano(), func(_, k string) bool { return k == key },
					func(shard.BucketState) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
			r, err := a.Token().AcquireToken(ask, &pb.AcquireTokenRequest{Rule: "cq", Key: key})
			if got := handoffReason(err); got != tc.want || (tc.want == "" && (err != nil || !r.GetAllowed() || r.GetRemaining() != 1)) {
				t.Fatalf("acquire asked of the old owner: %v, %v (reason %q); want reason %q", r, err, got, tc.want)
			}
			rr, err := a.Token().RefillToken(ask, &pb.RefillTokenRequest{Rule: "cq", Key: key, GrantId: lease.GetGrantId()})
			if got := handoffReason(err); got != tc.want || (tc.want == "" && (err != nil || rr.GetRefilled() != 1)) {
				t.Fatalf("release asked of the old owner: %v, %v (reason %q); want reason %q", rr, err, got, tc.want)
			}
		})
	}
	t.Run("no bucket", func(t *testing.T) {
		_, err := a.Token().AcquireToken(ask, &pb.AcquireTokenRequest{Rule: "cq", Key: c.KeyOwnedBy(b.ID, "none")})
		if got := handoffReason(err); got != server.NotHereReason {
			t.Fatalf("acquire of a key a holds nothing of, asked of a: %v (reason %q); want %q", err, got, server.NotHereReason)
		}
	})
}

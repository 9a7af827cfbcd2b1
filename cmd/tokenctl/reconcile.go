package main

import (
	"context"
	"crypto/rand"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// An UNAVAILABLE answer to a rule write does not prove that the write
// failed: the leader may have committed it and lost the answer. Every
// rule write carries a request id (newRequestID), so that a cluster that
// remembers it answers the retry with the first result. For a cluster
// that does not (an older release, or an id it has forgotten): gRPC
// retries the write (serviceConfig), and the retry of a compare-and-set
// put whose first attempt committed answers FAILED_PRECONDITION (its
// expected_version is stale by its own write); the retry of a delete
// answers NOT_FOUND. When a write that saw UNAVAILABLE ends so, tokenctl
// reads the rule: if it is what the write asked for (or gone, for a
// delete), the write succeeded, and tokenctl says so instead of failing.

// reconcileWrite returns the outcome of the call method(req) that ended
// with err after rec's attempts, filling reply when a write found to have
// committed is reported as a success.
func (a *app) reconcileWrite(ctx context.Context, cc *grpc.ClientConn, method string, req, reply any, rec *attempts, err error) error {
	if n, _ := rec.unavailable(); n == 0 || err == nil {
		return err
	}
	admin := pb.NewAdminServiceClient(cc)
	switch method {
	case pb.AdminService_PutRule_FullMethodName:
		put, ok := req.(*pb.PutRuleRequest)
		out, okReply := reply.(*pb.PutRuleResponse)
		if !ok || !okReply || put.ExpectedVersion == nil || status.Code(err) != codes.FailedPrecondition {
			return err
		}
		got, gerr := admin.GetRule(ctx, &pb.GetRuleRequest{Name: put.GetRule().GetName()})
		if gerr != nil || got.GetVersion() <= put.GetExpectedVersion() || !sameRule(got, put.GetRule()) {
			return err
		}
		a.logf("rule %q: an attempt that answered Unavailable had committed this write (now version %d); a retry saw its own write as a version conflict",
			got.GetName(), got.GetVersion())
		out.Rule = got
		return nil
	case pb.AdminService_DeleteRule_FullMethodName:
		del, ok := req.(*pb.DeleteRuleRequest)
		if c := status.Code(err); !ok || c != codes.NotFound && c != codes.FailedPrecondition {
			return err
		}
		if _, gerr := admin.GetRule(ctx, &pb.GetRuleRequest{Name: del.GetName()}); status.Code(gerr) != codes.NotFound {
			return err
		}
		a.logf("rule %q: an attempt that answered Unavailable had deleted it; a retry found it gone", del.GetName())
		return nil
	}
	return err
}

// sameRule reports whether the stored rule is the one a write asked for:
// equal once both are put in the server's canonical form (sorted lists)
// and the fields the server sets (version, generation, author) are
// ignored. Fields tokenctl's rule model does not know yet must be equal
// as they are.
func sameRule(stored, asked *pb.Rule) bool {
	canon := func(r *pb.Rule) *pb.Rule {
		rr := rulepb.FromProto(r)
		rr.Normalize()
		return rulepb.ToProto(rr)
	}
	if !proto.Equal(canon(stored), canon(asked)) {
		return false
	}
	// The fields rulepb does not carry (those added after the first
	// release) are compared as they are, on copies without the others.
	rest := func(r *pb.Rule) *pb.Rule {
		c := proto.Clone(r).(*pb.Rule)
		c.Name, c.Algorithm, c.Limit, c.Period, c.Burst, c.SampleCount = "", 0, 0, nil, 0, 0
		c.Warmup, c.Penalty, c.MaxKeys, c.Overrides, c.Deny, c.Allow = nil, nil, 0, nil, nil, nil
		c.Shadow, c.Fallback, c.Lease, c.Version, c.Generation, c.UpdatedBy = false, nil, nil, 0, 0, ""
		return c
	}
	return proto.Equal(rest(stored), rest(asked))
}

// newRequestID returns a fresh idempotency key for one rule write: a
// random UUID (version 4) in its usual text form, which logs and audit
// lines make easy to read. The write's message carries it, so gRPC's
// retries of the write (serviceConfig) send the same id and the cluster
// answers a retry of a write it already applied with the first result.
// Hand-written: 16 random bytes do not need a dependency.
func newRequestID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on supported platforms
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

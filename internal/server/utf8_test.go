package server

import (
	"bytes"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// rawCodec sends requests as given bytes and decodes responses as proto.
type rawCodec struct{ raw []byte }

func (c rawCodec) Marshal(any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(c.raw)}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
func (rawCodec) Name() string { return "proto" }

// TestInvalidUTF8 sends requests whose string fields hold invalid UTF-8 (no
// Go client can build them): each is InvalidArgument naming the field, not
// gRPC's INTERNAL decoding error, and a later valid call is unaffected.
func TestInvalidUTF8(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("api", 5))
	bad := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Replace(b, []byte("BADX"), []byte("\xff\xfe\xc3("), 1)
	}
	for _, tc := range []struct {
		method string
		raw    []byte
		want   string
	}{
		{pb.TokenService_AcquireToken_FullMethodName, bad(&pb.AcquireTokenRequest{Rule: "api", Key: "BADX"}), "key is not valid UTF-8"},
		{pb.TokenService_AcquireTokens_FullMethodName, bad(&pb.AcquireTokensRequest{Requests: []*pb.AcquireTokenRequest{{Rule: "api", Key: "ok"}, {Rule: "api", Key: "BADX"}}}), "requests[1].key is not valid UTF-8"},
		{pb.AdminService_PutRule_FullMethodName, bad(&pb.PutRuleRequest{Rule: &pb.Rule{Name: "r", Deny: []string{"a", "BADX"}}}), "rule.deny[1] is not valid UTF-8"},
	} {
		err := tn.conn.Invoke(ctx(t), tc.method, &pb.AcquireTokenRequest{}, new(pb.AcquireTokenResponse), grpc.ForceCodecV2(rawCodec{tc.raw}))
		wantCode(t, err, codes.InvalidArgument, tc.want)
	}
	if _, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if n := tn.node.codec.pending.Load(); n != 0 {
		t.Fatalf("%d bad requests still remembered", n)
	}
}

package server

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestEncodedViewOnTheWire: the node's codec sends a publication's bytes as
// they are (the view is encoded once for every stream), and a stream
// decodes them to the view the node built, rules included.
func TestEncodedViewOnTheWire(t *testing.T) {
	v := &pb.ClusterView{Leader: "a", Epoch: 7, Ready: true, AnsweredBy: "a", Members: []*pb.Member{{Id: "a", GrpcAddr: "127.0.0.1:1"}},
		Rules: []*pb.ClientRule{{Name: "r", Limit: 5, Period: durationpb.New(time.Second)}}}
	enc := encodeView(v)
	out, err := newUTF8Codec().Marshal(enc)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Materialize(); string(got) != string(enc.wire) {
		t.Fatal("the codec did not send the publication's bytes")
	}
	var back pb.ClusterView
	if err := proto.Unmarshal(out.Materialize(), &back); err != nil || !proto.Equal(&back, v) {
		t.Fatalf("decoded %v (%v), want %v", &back, err, v)
	}
	// Through a real node's stream.
	tn := newTestNode(t, nil)
	if _, err := tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: &pb.Rule{Name: "r", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 5, Period: durationpb.New(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	st, err := tn.token.WatchClusterView(ctx(t), &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		got := recvWithin(t, "a view with the rule", st, 2*time.Second)
		if len(got.GetRules()) == 1 && got.GetRules()[0].GetName() == "r" && got.GetReady() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("last view %v", got)
		}
	}
}

package server

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// frozenOwner is a member whose gRPC server takes calls and never
// answers them, as a node behind a link that silently drops packets does.
type frozenOwner struct {
	pb.UnimplementedTokenServiceServer
}

func (frozenOwner) AcquireToken(ctx context.Context, _ *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (frozenOwner) AcquireTokens(ctx context.Context, _ *pb.AcquireTokensRequest) (*pb.AcquireTokensResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// withFrozen is a Standalone whose routing view also names a frozen member.
type withFrozen struct {
	*Standalone
	view *cluster.View
}

func (w *withFrozen) View() *cluster.View { return w.view }

// TestBatchAnswersWhatItCan: one owner that never answers does not fail
// the batch or the call: its items fail over to their next owner (here,
// this node) within the caller's deadline, and the other items are
// answered.
func TestBatchAnswersWhatItCan(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterTokenServiceServer(gs, frozenOwner{})
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	var st *withFrozen
	tn := newTestNodeWith(t, func(s *Standalone) DataPlane {
		st = &withFrozen{Standalone: s, view: cluster.NewView(2, []cluster.Member{{ID: "node-1", GRPCAddr: "bufnet"}, {ID: "frozen", GRPCAddr: lis.Addr().String()}})}
		return st
	})
	tn.put(t, tokenBucket("r", 100))
	var mine, theirs []string
	for i := 0; len(mine) < 3 || len(theirs) < 3; i++ {
		k := fmt.Sprintf("k%d", i)
		if o, _ := st.view.Owner(k); o.ID == "frozen" {
			theirs = append(theirs, k)
		} else {
			mine = append(mine, k)
		}
	}
	req := &pb.AcquireTokensRequest{}
	for _, k := range append(mine[:3], theirs[:3]...) {
		req.Requests = append(req.Requests, &pb.AcquireTokenRequest{Rule: "r", Key: k})
	}
	const deadline = time.Second
	c, cancel := context.WithTimeout(ctx(t), deadline)
	defer cancel()
	start := time.Now()
	resp, err := tn.token.AcquireTokens(c, req)
	if err != nil {
		t.Fatalf("the batch failed after %v: %v", time.Since(start), err)
	}
	for i, r := range resp.GetResults() {
		if codes.Code(r.GetStatus().GetCode()) != codes.OK || !r.GetResponse().GetAllowed() {
			t.Errorf("item %d (%s): %v", i, req.Requests[i].GetKey(), r.GetStatus())
		}
	}
	c2, cancel2 := context.WithTimeout(ctx(t), deadline)
	defer cancel2()
	if one, err := tn.token.AcquireToken(c2, &pb.AcquireTokenRequest{Rule: "r", Key: theirs[0]}); err != nil || !one.GetAllowed() {
		t.Fatalf("a frozen owner's key: %v, %v", one, err)
	}
	if got := time.Since(start); got > 2*deadline {
		t.Fatalf("took %v", got)
	}
}

package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestClusterDrainNotReady: a member drained with DrainMember (tokenctl
// cluster drain) reports not ready in its health, which /readyz mirrors.
func TestClusterDrainNotReady(t *testing.T) {
	c := testcluster.New(t, 3)
	f := c.Follower()
	if _, err := c.Leader().Admin().DrainMember(ctxT(t), &pb.DrainMemberRequest{Id: f.ID}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(f.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	notReady := func() bool {
		r, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
	}
	c.WaitFor("the drained member to report not ready", notReady)
	// It stays so: liveness does not take a drained member back into the
	// view once it has been healthy for up-after (2 s here).
	for range 30 {
		time.Sleep(100 * time.Millisecond)
		if !notReady() {
			t.Fatal("the drained member reports ready again")
		}
	}
}

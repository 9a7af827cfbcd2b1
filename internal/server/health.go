package server

import (
	"sync/atomic"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// MemberHealthService is the gRPC health service name a node reports
// SERVING under once it has caught up with the Raft log and while it is not
// draining: the leader's check before it puts the node in the routing view
// (the node's overall health, "", also needs it to be in the view).
const MemberHealthService = "tokenserver.v1.Member"

// readinessPoll is how often the node re-reads its readiness, which the
// Raft node changes without a signal of its own (but for RaftHooks.CaughtUp).
const readinessPoll = 20 * time.Millisecond

// updateHealth sets the health statuses from the node's state: the
// overall status and the services' are SERVING while the node serves, is
// ready and is not draining; MemberHealthService while it serves, has
// caught up with the log and is not draining. It reports readiness.
func (n *Node) updateHealth() bool {
	up := n.serving.Load() && !n.draining.Load()
	ready := up && n.data.Ready() && n.envoy.notReady() == ""
	member := up && n.data.CaughtUp()
	if n.ready.Swap(ready) != ready || n.memberHealthy.Swap(member) != member || !n.healthSet.Swap(true) {
		n.health.SetServingStatus("", servingStatus(ready))
		n.health.SetServingStatus(pb.TokenService_ServiceDesc.ServiceName, servingStatus(ready))
		n.health.SetServingStatus(pb.AdminService_ServiceDesc.ServiceName, servingStatus(ready))
		n.health.SetServingStatus(MemberHealthService, servingStatus(member))
	}
	return ready
}

func servingStatus(ok bool) healthpb.HealthCheckResponse_ServingStatus {
	if ok {
		return healthpb.HealthCheckResponse_SERVING
	}
	return healthpb.HealthCheckResponse_NOT_SERVING
}

// watchReadiness keeps the health statuses current until the node stops:
// every readinessPoll, and at once when the Raft node says it caught up.
func (n *Node) watchReadiness() {
	defer n.wg.Done()
	t := time.NewTicker(readinessPoll)
	defer t.Stop()
	logged := false
	for {
		if n.updateHealth() && !logged {
			logged = true
			n.log.Info("ready: serving the keys this node owns", "node", n.data.ID())
		}
		select {
		case <-n.done:
			return
		case <-t.C:
		case <-n.hooks.caughtUp:
		}
	}
}

// notReadyReason says in words why /readyz fails, "" when the node is
// ready.
func (n *Node) notReadyReason() string {
	switch {
	case n.ready.Load():
		return ""
	case n.draining.Load():
		return "draining (shutting down)"
	case !n.serving.Load():
		return "not serving yet"
	case n.envoy.notReady() != "":
		return n.envoy.notReady()
	case !n.data.CaughtUp():
		return "catching up with the Raft log"
	default:
		return "not in the routing view yet"
	}
}

// healthService is gRPC's health server with a cap on Watch streams:
// Check, what probes use, stays open and uncapped; each Watch holds a
// goroutine and a stream for as long as its caller likes, so at most
// Config.MaxHealthWatches run at once and one more gets ResourceExhausted.
type healthService struct {
	*health.Server
	watches atomic.Int64
	limit   int64
}

// Watch implements healthpb.HealthServer.
func (h *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if h.watches.Add(1) > h.limit {
		h.watches.Add(-1)
		return toError(failf(ErrStreamCap, "this node serves %d health Watch streams already (its cap); probe with Check", h.limit))
	}
	defer h.watches.Add(-1)
	return h.Server.Watch(req, stream)
}

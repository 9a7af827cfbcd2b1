// Package tokenserverv1 is the tokenserver.v1 API: the generated messages
// and services, and the hand-written wire constants beside them.
package tokenserverv1

// Wire constants that are part of the API but that protobuf cannot declare:
// request metadata, error reasons and limits. Servers and clients both use
// these; tokenserver.proto documents them next to the services. This file
// is hand-written, not generated.

// Request metadata (gRPC headers) of the TokenService.
const (
	// AvoidHeader names, comma-separated, the member ids the caller could
	// not reach. A key whose owner is among them is served by its next
	// owner in rendezvous order among the members not named, the owner the
	// view will give it once the named ones leave. The client SDK sets it
	// while a node's circuit breaker is open, and for a few seconds after
	// members left its view.
	AvoidHeader = "x-tokenserver-avoid"
	// ForwardedHeader marks a call one node forwarded to another; its value
	// is the epoch of the view the call was routed by ("1" if unknown). It
	// is served where it lands, unless the node there holds no bucket of
	// the key and its newer view gives the key to another member: then it
	// goes on to that owner, once per newer view. It counts only from a
	// peer (a node's certificate).
	ForwardedHeader = "x-tokenserver-forwarded"
	// PrincipalHeader carries, on a write a node forwards to another (a
	// follower to the leader), the caller it forwards for. It counts only
	// from a peer.
	PrincipalHeader = "x-tokenserver-principal"
	// ViewHeartbeatHeader, set to "1" on a WatchClusterView call, asks for
	// small heartbeats: the view is sent whole only when it changed, and
	// between changes a heartbeat, a ClusterView with the epoch, leader,
	// readiness and answered_by of the current view but no members and no
	// rules, meaning "nothing changed". Without it every message is the
	// whole view. The client SDK sets it.
	ViewHeartbeatHeader = "x-tokenserver-view-heartbeat"
)

// Error details.
const (
	// ErrorDomain is the google.rpc.ErrorInfo domain of tokenserver's
	// errors.
	ErrorDomain = "tokenserver.v1"
	// NotReadyReason is the google.rpc.ErrorInfo reason of the UNAVAILABLE
	// a node answers while it cannot decide yet (no routing view, or its
	// Raft log not replayed): it was reached and decided nothing, so the
	// call may be retried at once, there or on another member.
	NotReadyReason = "NOT_READY"
)

// MaxBatch is the most items one AcquireTokens call may carry; a larger
// batch is INVALID_ARGUMENT.
const MaxBatch = 1000

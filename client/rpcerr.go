package client

// Classifying the errors of calls to a node: never sent (safe to retry),
// not ready (reached, decided nothing), node failure (feeds the breaker).

import (
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// notSent reports whether err proves that the call never reached a server,
// so that sending it again (there or elsewhere) cannot spend twice: gRPC
// failed it while picking a connection, because the connection never
// became ready. It matches grpc-go's error text, the only thing that says
// so (rpcerr_test.go produces every fragment with the pinned grpc-go, so a
// bump that changes one fails a test):
//   - "Error while dialing", "connection refused": the dial failed;
//   - "produced zero addresses": the resolver had no address to dial;
//   - "failed to write client preface", "error reading server preface":
//     the connection broke before the HTTP/2 prefaces were exchanged;
//   - a bare "write: broken pipe" or "write: connection reset by peer": the
//     connection was reset before the server's preface, and grpc-go
//     returned the error of flushing its first frames unwrapped (see
//     resetBeforePreface);
//   - errLeftMsg: the SDK's own answer to a call it queued for a node that
//     left its view (or to a client closing) before the call was sent.
//
// A call that was written to a connection that later broke ("error reading
// from server: ... connection reset by peer"), or that timed out
// (DeadlineExceeded), is never taken as not sent: it may have spent tokens.
// A server that could not reach a key's owner names the owner's error in
// its own UNAVAILABLE ("... is unreachable: <error>"), so the same rules
// hold for a forwarded call.
func notSent(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	msg := st.Message()
	return msg == errLeftMsg ||
		strings.Contains(msg, "Error while dialing") ||
		strings.Contains(msg, "connection refused") ||
		strings.Contains(msg, "produced zero addresses") ||
		// The connection closed before the server's preface: it never
		// became ready, so no call was written to it (the picker failed
		// the call with the connection's last error).
		strings.Contains(msg, "error reading server preface") ||
		strings.Contains(msg, "failed to write client preface") ||
		resetBeforePreface(msg)
}

// errLeftMsg is the message of the Unavailable the SDK answers a call with
// that it queued for a node and never sent, because the node left the
// client's view or the client closed (node.acquire, node.drain).
const errLeftMsg = "node left the view or client closed: the call was not sent"

// resetBeforePreface reports whether msg is the bare socket error that
// grpc-go's transport returns, unwrapped, when flushing its first frames
// (the settings after the client preface) fails because the server reset
// the connection: the connection never became ready. Every error of a
// connection that did become ready reaches a call wrapped as a connection
// error ("connection error: desc = ..."), so a message with that wrapper is
// never this one.
func resetBeforePreface(msg string) bool {
	if strings.Contains(msg, "connection error:") {
		return false
	}
	return strings.Contains(msg, "write: broken pipe") || strings.Contains(msg, "write: connection reset by peer")
}

// isNotReady reports whether err is a node's answer that it cannot decide
// yet (no routing view, or its Raft log not replayed): the node was
// reached and decided nothing, so the call may go again, to it or to
// another member. Servers before the reason existed said "no routing view".
func isNotReady(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == pb.NotReadyReason {
			return true
		}
	}
	return strings.Contains(st.Message(), "no routing view")
}

// isAuthError reports whether err is a refusal of the client's
// credentials: Unauthenticated, PermissionDenied, or a TLS handshake that
// failed (grpc-go reports it as Unavailable, "authentication handshake
// failed", with the x509 or tls error). Such a node answered; the client
// is misconfigured.
func isAuthError(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	case codes.Unavailable:
		msg := st.Message()
		return strings.Contains(msg, "authentication handshake failed") || strings.Contains(msg, "x509: ")
	}
	return false
}

// isNodeFailure reports whether err says the node could not answer (as
// opposed to an answer that is an error, like NotFound, ResourceExhausted
// or a refusal of the credentials).
func isNodeFailure(err error) bool {
	if isAuthError(err) {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

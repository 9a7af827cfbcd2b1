package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// This file is the one place where errors become gRPC statuses (etcd's
// v3rpc/util.go): handlers return the sentinel errors below, wrapped with
// a message through failf, or the errors of rule, shard and raftfsm, and
// toStatus maps them. Nothing else in the package builds a status.

// Sentinel errors of the server, each mapped to one gRPC code by toStatus.
var (
	// ErrBadRequest is a request the server refuses as it is: a field out
	// of range, missing, or not valid UTF-8 (InvalidArgument).
	ErrBadRequest = errors.New("bad request")
	// ErrNotReady is a node that was reached and decided nothing yet: no
	// routing view, or its Raft log not replayed (Unavailable with the
	// NotReadyReason ErrorInfo; the SDK retries at once).
	ErrNotReady = errors.New("node not ready")
	// ErrUnavailable is an answer that cannot be given now: the node is
	// stopping, a peer cannot be reached, leadership moved (Unavailable).
	ErrUnavailable = errors.New("unavailable")
	// ErrStreamCap is a WatchClusterView stream past the node's cap
	// (ResourceExhausted).
	ErrStreamCap = errors.New("too many view streams")
	// ErrNoRaft is a membership or snapshot call on a node without Raft
	// (FailedPrecondition).
	ErrNoRaft = errors.New("no raft")
	// ErrWrongNode is a peer acting for a node its certificate does not
	// name (PermissionDenied).
	ErrWrongNode = errors.New("wrong node")
	// ErrNoMember is a membership call naming a member the cluster does
	// not have (NotFound).
	ErrNoMember = errors.New("no such member")
	// ErrUnauthenticated is a call whose credentials are refused before
	// they are checked: an authorization header too long to be a token
	// (Unauthenticated).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrInternal is a bug: a panic in a handler, an answer that cannot
	// be (Internal).
	ErrInternal = errors.New("internal error")
)

// failure is an error of a sentinel kind whose message, the one a caller
// reads, is msg alone.
type failure struct {
	kind error
	msg  string
}

func (f *failure) Error() string { return f.msg }
func (f *failure) Unwrap() error { return f.kind }

// failf returns an error that is kind (errors.Is) with the formatted
// message.
func failf(kind error, format string, args ...any) error {
	return &failure{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// toStatus maps an error to the gRPC status a client sees. It is the one
// place where errors become codes; a status error (from a peer, or auth)
// passes unchanged.
func toStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s
	}
	switch {
	case errors.Is(err, rule.ErrInvalid), errors.Is(err, ErrBadRequest):
		return status.New(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrNoMember), errors.Is(err, rule.ErrNotFound), errors.Is(err, shard.ErrGrantNotFound), errors.Is(err, shard.ErrGrantExpired):
		return status.New(codes.NotFound, err.Error())
	case errors.Is(err, rule.ErrVersionMismatch), errors.Is(err, raftfsm.ErrRefused), errors.Is(err, ErrNoRaft), errors.Is(err, raftfsm.ErrRemoved):
		return status.New(codes.FailedPrecondition, err.Error())
	case errors.Is(err, rule.ErrNoLeader):
		return status.New(codes.Unavailable, err.Error()+"; retry with backoff")
	case errors.Is(err, ErrNotReady):
		st := status.New(codes.Unavailable, err.Error())
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: NotReadyReason, Domain: pb.ErrorDomain}); derr == nil {
			return d
		}
		return st
	case errors.Is(err, ErrUnavailable), errors.Is(err, shard.ErrMoved):
		return status.New(codes.Unavailable, err.Error())
	case errors.Is(err, ErrStreamCap):
		return status.New(codes.ResourceExhausted, err.Error())
	case errors.Is(err, ErrUnauthenticated):
		return status.New(codes.Unauthenticated, err.Error())
	case errors.Is(err, ErrWrongNode):
		return status.New(codes.PermissionDenied, err.Error())
	case errors.Is(err, shard.ErrBucketCap), errors.Is(err, shard.ErrMaxKeys), errors.Is(err, rule.ErrTooManyRules):
		subject := "node"
		if errors.Is(err, shard.ErrMaxKeys) {
			subject = "rule"
		} else if errors.Is(err, rule.ErrTooManyRules) {
			subject = "cluster"
		}
		s := status.New(codes.ResourceExhausted, err.Error())
		if d, derr := s.WithDetails(&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject, Description: err.Error()}}}); derr == nil {
			return d
		}
		return s
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, err.Error())
	}
	return status.New(codes.Internal, err.Error())
}

// toError is toStatus as an error for returning from a handler.
func toError(err error) error {
	if err == nil {
		return nil
	}
	return toStatus(err).Err()
}

// codeOf is the gRPC code toStatus gives err.
func codeOf(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return toStatus(err).Code()
}

// peerError turns a failed call to another node into the error the caller
// sees: the node's own status, or Unavailable when it could not be
// reached (a status Unavailable or Unknown, or an error that is no status).
func peerError(who string, err error) error {
	s, ok := status.FromError(err)
	if !ok && errors.Is(err, ErrUnavailable) {
		s, ok = toStatus(err), true
	}
	if !ok {
		return status.Errorf(codes.Unavailable, "%s: %v", who, err)
	}
	if s.Code() == codes.Unavailable || s.Code() == codes.Unknown {
		return status.Errorf(codes.Unavailable, "%s is unreachable: %s", who, s.Message())
	}
	return err
}

// unreachable reports whether a forwarded call's error says the owner
// could not decide it (down, unreachable or not ready), so that its next
// owner should.
func unreachable(err error) bool {
	return codeOf(err) == codes.Unavailable
}

// memberError is err of a membership call about member id, with the
// control plane's not-found (which it reports as rule.ErrNotFound) said
// as what it is: the member is not in the cluster.
func memberError(id string, err error) error {
	if err != nil && !errors.As(err, new(*rule.LeaderError)) && errors.Is(err, rule.ErrNotFound) {
		return failf(ErrNoMember, "member %q is not in the cluster", id)
	}
	return err
}

package server

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
)

// toStatus maps an internal error to the gRPC status a client sees. It is the
// one place where errors become codes.
func toStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s
	}
	switch {
	case errors.Is(err, rule.ErrInvalid):
		return status.New(codes.InvalidArgument, err.Error())
	case errors.Is(err, rule.ErrNotFound):
		return status.New(codes.NotFound, err.Error())
	case errors.Is(err, rule.ErrVersionMismatch), errors.Is(err, raftfsm.ErrRefused):
		return status.New(codes.FailedPrecondition, err.Error())
	case errors.Is(err, rule.ErrNoLeader):
		return status.New(codes.Unavailable, err.Error()+"; retry with backoff")
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

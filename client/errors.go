package client

import (
	"errors"
	"fmt"
	"time"
)

// Errors returned by the SDK. Each is wrapped with context; test with
// errors.Is.
var (
	// ErrDenied means the limit was reached: the server, a lease or the
	// local fallback limiter said no. Errors that are ErrDenied are a
	// *DeniedError carrying the retry-after.
	ErrDenied = errors.New("tokenserver: denied")
	// ErrUnavailable means the server could not answer and the rule's
	// fallback policy says deny.
	ErrUnavailable = errors.New("tokenserver: unavailable")
	// ErrInvalid means the request is malformed (an empty or too long key,
	// negative permits, a max_wait the rule does not allow, ...); the
	// server's INVALID_ARGUMENT.
	ErrInvalid = errors.New("tokenserver: invalid request")
	// ErrNotFound means the server knows no rule of that name.
	ErrNotFound = errors.New("tokenserver: rule not found")
	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("tokenserver: client closed")
)

// DeniedError is a denial returned as an error (by Wait, WaitN and
// Acquire). It is ErrDenied for errors.Is.
type DeniedError struct {
	// RetryAfter is how long to wait before trying again.
	RetryAfter time.Duration
	// Reason says why, for people.
	Reason string
}

// Error implements error.
func (e *DeniedError) Error() string {
	return fmt.Sprintf("tokenserver: denied (%s), retry after %v", e.Reason, e.RetryAfter)
}

// Is makes a DeniedError match ErrDenied.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

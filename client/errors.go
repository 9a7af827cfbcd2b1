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
	// ErrAuth means the server refused this client's credentials: a token
	// it does not know (Unauthenticated), a credential without the client
	// role (PermissionDenied), or a TLS handshake that failed verification
	// (an x509 error: a wrong CA, a certificate name mismatch). It is the
	// client's misconfiguration, not an unreachable server: New and every
	// call return it (as an *AuthError), and the fallback policy never
	// turns it into an allow.
	ErrAuth = errors.New("tokenserver: credentials refused")
	// ErrLimiterOptions means Client.Limiter was called again for a rule
	// with options that differ from the first call's (see Client.Limiter).
	ErrLimiterOptions = errors.New("tokenserver: limiter options differ from the first call's")
	// ErrReservationNotFound means the server does not know the grant a
	// commit names: its reservation TTL passed (it stays charged at its
	// estimate), it was minted for another rule or key, or its node
	// restarted since. Nothing changed.
	ErrReservationNotFound = errors.New("tokenserver: reservation not found or expired")
)

// AuthError is a refusal of the client's credentials. It is ErrAuth for
// errors.Is, and unwraps to the gRPC status error (status.Code and
// status.FromError see its code).
type AuthError struct {
	// Err is the RPC's error.
	Err error
}

// Error implements error.
func (e *AuthError) Error() string {
	return "tokenserver: credentials refused (check the token, its roles, and the TLS settings): " + e.Err.Error()
}

// Is makes an AuthError match ErrAuth.
func (e *AuthError) Is(target error) bool { return target == ErrAuth }

// Unwrap returns the RPC's error.
func (e *AuthError) Unwrap() error { return e.Err }

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

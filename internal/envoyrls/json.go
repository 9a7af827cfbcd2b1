package envoyrls

import (
	"context"
	"errors"
	"io"
	"net/http"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// MaxJSONBody bounds the body of a /json request.
const MaxJSONBody = 4 << 20

// ShouldRateLimitFunc decides one request, as the gRPC method does.
type ShouldRateLimitFunc func(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error)

// HTTPError is an error of a ShouldRateLimitFunc that NewJSONHandler
// answers with its own status and message rather than the reference's
// 400 "Bad Request": a refused credential (401, 403), or a node that
// decides nothing and says what to do instead.
type HTTPError struct {
	Code int
	Msg  string
}

func (e *HTTPError) Error() string { return e.Msg }

// NewJSONHandler is the reference's /json endpoint: a RateLimitRequest in
// proto3 JSON in the body (any method), the RateLimitResponse in proto3 JSON
// out, 200 when OK, 429 when OVER_LIMIT, 400 "Bad Request" for a body that
// does not parse or a request that fails, 500 for an UNKNOWN overall code.
// An *HTTPError from fn is answered with its code and message.
func NewJSONHandler(fn ShouldRateLimitFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
		if err != nil {
			writeStatus(w, http.StatusBadRequest)
			return
		}
		var req rlpb.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			writeStatus(w, http.StatusBadRequest)
			return
		}
		resp, err := fn(r.Context(), &req)
		var he *HTTPError
		if errors.As(err, &he) {
			http.Error(w, he.Msg, he.Code)
			return
		}
		if err != nil {
			writeStatus(w, http.StatusBadRequest)
			return
		}
		if resp == nil {
			writeStatus(w, http.StatusInternalServerError)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			writeStatus(w, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch resp.GetOverallCode() {
		case rlpb.RateLimitResponse_UNKNOWN:
			w.WriteHeader(http.StatusInternalServerError)
		case rlpb.RateLimitResponse_OVER_LIMIT:
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
}

func writeStatus(w http.ResponseWriter, code int) {
	http.Error(w, http.StatusText(code), code)
}

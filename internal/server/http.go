package server

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// httpHandler serves /healthz (the process is up), /readyz (the node
// answers requests), /metrics and the web console under /ui/.
func (n *Node) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", n.protectMetrics(n.metrics.handler()))
	mux.Handle("/json", n.envoy.jsonHandler())
	mux.Handle("/ui/", n.consoleHandler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := n.notReadyReason(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// protectMetrics guards /metrics by Config.MetricsAuth: "token" asks for
// an `Authorization: Bearer TOKEN` header whose principal has the viewer
// role (checked as NodeStatus is); anything else serves h to anyone.
func (n *Node) protectMetrics(h http.Handler) http.Handler {
	if n.cfg.MetricsAuth != "token" || n.auth == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hdr := r.Header.Get("Authorization")
		var err error
		if hdr == "" {
			err = failf(ErrUnauthenticated, "/metrics needs `Authorization: Bearer TOKEN` with the viewer role (--metrics-auth=token)")
		} else if len(hdr) > MaxAuthorizationBytes {
			err = failf(ErrUnauthenticated, "the authorization header is %d bytes; a bearer token is at most %d", len(hdr), MaxAuthorizationBytes)
		} else {
			ctx := metadata.NewIncomingContext(r.Context(), metadata.Pairs("authorization", hdr))
			_, err = n.auth.Authorize(ctx, pb.AdminService_NodeStatus_FullMethodName)
		}
		if err != nil {
			st := toStatus(err)
			n.metrics.authFailures.WithLabelValues(st.Code().String()).Inc()
			code := http.StatusUnauthorized
			if st.Code() == codes.PermissionDenied {
				code = http.StatusForbidden
			}
			http.Error(w, st.Message(), code)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// newHTTPServer is an HTTP server with timeouts on reading a request and
// on idle connections (no write timeout: a CPU profile takes 30 s).
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
}

// pprofHandler serves Go's profiles under /debug/pprof/.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Command httpmiddleware is a small HTTP service that limits each user with
// the tokenserver SDK and answers 429 Too Many Requests with Retry-After.
//
//	go run ./examples/httpmiddleware --tokenserver 127.0.0.1:7070 --rule per-user
//	curl -i -H 'X-User: alice' localhost:8080/
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tokenserver/tokenserver/client"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "HTTP listen address")
	servers := flag.String("tokenserver", "127.0.0.1:7070", "tokenserver gRPC addresses (comma-separated seeds)")
	ruleName := flag.String("rule", "per-user", "the tokenserver rule limiting each user")
	timeout := flag.Duration("call-timeout", client.DefaultCallTimeout, "deadline of one call to the tokenserver")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	c, err := client.New(startCtx, strings.Split(*servers, ","), client.WithCallTimeout(*timeout), client.WithLogger(log))
	cancel()
	if err != nil {
		log.Error("tokenserver client", "err", err)
		os.Exit(1)
	}
	defer c.Close()
	if c.InFallback() {
		log.Warn("tokenserver not reachable yet; limiting locally by the fallback policy")
	}

	srv := &http.Server{Addr: *addr, Handler: newHandler(c.Limiter(*ruleName)), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Info("serving", "addr", *addr, "rule", *ruleName)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("http", "err", err)
		os.Exit(1)
	}
}

// newHandler is the service: hello, behind the per-user limit.
func newHandler(lim *client.Limiter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello, %s\n", user(r))
	})
	return Limit(lim, mux)
}

// Limit admits each request against lim, keyed by its user; it answers 429
// with Retry-After (whole seconds, rounded up) when the user is over the
// limit, and 503 when the tokenserver is unreachable and the rule's
// fallback policy denies.
func Limit(lim *client.Limiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := lim.AllowN(r.Context(), user(r), 1)
		switch {
		case errors.Is(err, client.ErrInvalid):
			http.Error(w, "bad user", http.StatusBadRequest)
		case errors.Is(err, client.ErrUnavailable):
			w.Header().Set("Retry-After", retryAfter(d.RetryAfter))
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
		case !d.Allowed:
			w.Header().Set("Retry-After", retryAfter(d.RetryAfter))
			http.Error(w, "too many requests", http.StatusTooManyRequests)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// user is the X-User header, else the user query parameter, else the
// client's IP address.
func user(r *http.Request) string {
	if u := r.Header.Get("X-User"); u != "" {
		return u
	}
	if u := r.URL.Query().Get("user"); u != "" {
		return u
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// retryAfter is d in whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/client"
	"github.com/tokenserver/tokenserver/internal/loadgen"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func newBenchCmd(a *app) *cobra.Command {
	var o loadgen.Options
	cmd := &cobra.Command{
		Use:   "bench --rule NAME [--mode unary|batch|lease] | bench --mode bare",
		Short: "Load a server with acquires and report throughput and latency",
		Long: `Load a server for --duration from --concurrency goroutines over --conns gRPC
connections, each making one call after another, and report calls, RPC/s,
decisions/s, allowed and denied counts, errors and latency percentiles.

Modes:
  unary  one AcquireToken per call, on a random one of --keys keys
  batch  --batch items (random keys) per AcquireTokens call
  lease  the Go client SDK with leases: one Limiter.AllowN per call, served
         from a local lease for hot keys (the rule must allow leases);
         rpc/s counts the SDK's acquire and refill RPCs
  bare   grpc.health.v1.Health/Check, called the same way: what gRPC itself
         costs on this machine. Point it at 'tokenctl bench-server', a
         minimal gRPC server, to compare AcquireToken with a bare call.

Latency is every call's, measured in the caller, in a log-linear histogram
(under 1% error). A progress line goes to stderr every second; -o json prints
the summary as one JSON line. The rule must exist (NotFound otherwise).
Calls are not retried: failures count as errors.`,
		Example: `  tokenctl rule put bench --algorithm token-bucket --limit 1000000000 --period 1s
  taskset -c 0 tokenserver &
  taskset -c 1 tokenctl bench --rule bench --mode unary --duration 10s
  taskset -c 1 tokenctl bench --rule bench --mode batch --batch 100 -o json

  taskset -c 0 tokenctl bench-server --addr 127.0.0.1:7099 &
  taskset -c 1 tokenctl bench --mode bare --server 127.0.0.1:7099`,
		Args: argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return &usageError{err}
			}
			res, err := a.bench(cmd, o)
			if err != nil {
				return err
			}
			if a.structured() {
				if err := a.writeLine(res); err != nil {
					return err
				}
			} else if err := res.WriteTable(a.stdout); err != nil {
				return err
			}
			if res.Calls > 0 && res.Errors == res.Calls {
				return fmt.Errorf("bench: all %d calls failed: %s", res.Calls, res.FirstError)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Mode, "mode", loadgen.ModeUnary, "unary, batch, lease or bare")
	fl.Int64Var(&o.LeaseMax, "lease-max", 0, "lease mode: most tokens per lease (0: the rule's lease.max_batch)")
	fl.DurationVar(&o.LeaseTTL, "lease-ttl", 0, "lease mode: lease lifetime (0: the rule's lease.ttl)")
	fl.StringVar(&o.Rule, "rule", "", "the rule to acquire under (required for unary and batch)")
	fl.IntVar(&o.Concurrency, "concurrency", 64, "goroutines calling concurrently")
	fl.IntVar(&o.Keys, "keys", 1000, "distinct keys, chosen at random per item")
	fl.DurationVar(&o.Duration, "duration", 10*time.Second, "how long to load the server")
	fl.IntVar(&o.Batch, "batch", 100, "items per AcquireTokens call (batch mode; at most 1000)")
	fl.IntVar(&o.Conns, "conns", 1, "gRPC connections to spread the goroutines over")
	fl.Int64Var(&o.Permits, "permits", 1, "permits per item")
	fl.StringVar(&o.KeyPrefix, "key-prefix", "bench-", "prefix of the keys (key-prefix + number)")
	return cmd
}

// bench connects, checks the rule, and runs the load (internal/loadgen).
func (a *app) bench(cmd *cobra.Command, o loadgen.Options) (*loadgen.Result, error) {
	// The generator runs with the servers' GC target (unless GOGC is set),
	// the same in every mode, so that it is not what limits the figures.
	if _, set := os.LookupEnv("GOGC"); !set {
		defer debug.SetGCPercent(debug.SetGCPercent(400))
	}
	// The load's connections do not wait or retry: a failed call counts
	// as an error.
	conns := make([]*grpc.ClientConn, o.Conns)
	probes := make([]*connProbe, o.Conns)
	for i := range conns {
		c, probe, err := a.dialDirect()
		if err != nil {
			return nil, err
		}
		defer c.Close()
		conns[i], probes[i] = c, probe
	}
	setup, cancel := a.context(cmd, 0)
	defer cancel()
	var rule *pb.Rule
	if o.Mode != loadgen.ModeBare {
		c, err := a.dial()
		if err != nil {
			return nil, err
		}
		defer c.Close()
		err = a.call(setup, fmt.Sprintf("bench: get rule %q", o.Rule), func(ctx context.Context) (err error) {
			rule, err = pb.NewAdminServiceClient(c).GetRule(ctx, &pb.GetRuleRequest{Name: o.Rule})
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	// Connect every connection before the clock starts, waiting for the
	// server up to --timeout.
	for i, c := range conns {
		err := a.call(setup, fmt.Sprintf("bench: connect %d", i+1), func(ctx context.Context) error {
			ctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			stop := a.watchConn(ctx, c, probes[i], cancel)
			_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			stop()
			if o.Mode != loadgen.ModeBare && status.Code(err) == codes.Unimplemented {
				return nil
			}
			return a.unreachable(ctx, c, nil, err)
		})
		if err != nil {
			return nil, err
		}
	}
	if rule != nil {
		a.logf("bench: %s mode, rule %s (%s, limit %d per %s), %d callers over %d connection(s), %d keys, for %v",
			o.Mode, rule.GetName(), algorithmName(rule.GetAlgorithm()), rule.GetLimit(), fmtDur(rule.GetPeriod()), o.Concurrency, o.Conns, o.Keys, o.Duration)
	} else {
		a.logf("bench: bare mode (grpc.health.v1.Health/Check), %d callers over %d connection(s), for %v", o.Concurrency, o.Conns, o.Duration)
	}
	target := loadgen.Target{Server: a.server, Conns: conns, Logf: a.logf}
	if o.Mode == loadgen.ModeLease {
		if rule.GetLease().GetMaxBatch() == 0 {
			return nil, usagef("rule %q allows no leases (set --lease-max and --lease-ttl on the rule)", o.Rule)
		}
		sec, err := a.sec.clientOptions()
		if err != nil {
			return nil, err
		}
		reg := prometheus.NewRegistry()
		c, err := client.New(setup, []string{a.server}, append(sec, client.WithMetrics(reg), client.WithCallTimeout(time.Second))...)
		if err != nil {
			return nil, fmt.Errorf("bench: client: %w", err)
		}
		defer c.Close()
		target.Limiter = c.Limiter(o.Rule, client.WithLease(o.LeaseMax, o.LeaseTTL))
		target.Metrics = reg
	}
	// The load stops after --duration; the context is a backstop for a
	// call that hangs, and ends the run early on an interrupt.
	load, cancelLoad := context.WithTimeout(cmd.Context(), o.Duration+a.timeout)
	defer cancelLoad()
	return loadgen.Run(load, target, o)
}

func newBenchServerCmd(a *app) *cobra.Command {
	var (
		addr                string
		duration            time.Duration
		gcPercent           int
		serveCert, serveKey string
	)
	cmd := &cobra.Command{
		Use:   "bench-server",
		Short: "Serve a minimal gRPC service for 'bench --mode bare'",
		Long: `Serve grpc.health.v1.Health (google.golang.org/grpc/health, always SERVING)
and nothing else, with the gRPC server settings and GC target tokenserver
uses (32 stream workers, --gc-percent 400): the trivial unary call that
'bench --mode bare' measures, so that AcquireToken's RPC/s reads as a
fraction of what gRPC itself allows on this machine. Prints the address it
listens on to stdout and serves until interrupted or --duration passes.`,
		Example: `  taskset -c 0 tokenctl bench-server --addr 127.0.0.1:7099 &
  taskset -c 1 tokenctl bench --mode bare --server 127.0.0.1:7099`,
		Args: argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if duration < 0 {
				return usagef("--duration must be >= 0, got %v", duration)
			}
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("bench-server: listen on --addr %s: %w", addr, err)
			}
			// The same stream-worker pool as tokenserver, so the two are
			// measured with the same gRPC server settings.
			opts := []grpc.ServerOption{grpc.NumStreamWorkers(32)}
			if (serveCert == "") != (serveKey == "") {
				lis.Close()
				return usagef("--serve-cert and --serve-key go together")
			}
			if serveCert != "" {
				pair, err := tls.LoadX509KeyPair(serveCert, serveKey)
				if err != nil {
					lis.Close()
					return fmt.Errorf("bench-server: %w", err)
				}
				opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}})))
			}
			s := grpc.NewServer(opts...)
			if _, set := os.LookupEnv("GOGC"); !set {
				debug.SetGCPercent(gcPercent)
			}
			hs := health.NewServer()
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			healthpb.RegisterHealthServer(s, hs)
			served := make(chan error, 1)
			go func() { served <- s.Serve(lis) }()
			if a.structured() {
				err = a.writeLine(map[string]string{"addr": lis.Addr().String()})
			} else {
				_, err = fmt.Fprintln(a.stdout, lis.Addr().String())
			}
			if err != nil {
				s.Stop()
				return err
			}
			a.logf("bench-server: serving grpc.health.v1.Health on %s", lis.Addr())
			ctx := cmd.Context()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			select {
			case <-ctx.Done():
				s.Stop()
				<-served
				return nil
			case err := <-served:
				return fmt.Errorf("bench-server: %w", err)
			}
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:0", "address to listen on (port 0 picks a free one)")
	cmd.Flags().IntVar(&gcPercent, "gc-percent", 400, "Go GC target percentage, as tokenserver's --gc-percent (unless GOGC is set)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop after this long (0: until interrupted)")
	cmd.Flags().StringVar(&serveCert, "serve-cert", "", "serve TLS with this PEM certificate (as tokenserver's --tls-cert), to measure 'bench --mode bare' over TLS")
	cmd.Flags().StringVar(&serveKey, "serve-key", "", "PEM private key of --serve-cert")
	return cmd
}

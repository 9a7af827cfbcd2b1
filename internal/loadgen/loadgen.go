package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Bench modes.
const (
	modeUnary = "unary" // one AcquireToken per call
	modeBatch = "batch" // --batch items per AcquireTokens call
	modeBare  = "bare"  // grpc.health.v1.Health/Check: gRPC's own cost
	modeLease = "lease" // the client SDK with leases: Allow served locally
)

// maxBenchBatch is the server's limit of items per AcquireTokens call.
const maxBenchBatch = 1000

type benchOpts struct {
	mode        string
	rule        string
	concurrency int
	keys        int
	duration    time.Duration
	batch       int
	conns       int
	permits     int64
	keyPrefix   string
	leaseMax    int64
	leaseTTL    time.Duration
}

// benchResult is bench's summary; its JSON is one line.
type benchResult struct {
	Mode        string  `json:"mode"`
	Server      string  `json:"server"`
	Rule        string  `json:"rule,omitempty"`
	Concurrency int     `json:"concurrency"`
	Conns       int     `json:"conns"`
	Keys        int     `json:"keys,omitempty"`
	Batch       int     `json:"batch,omitempty"`
	DurationSec float64 `json:"duration_sec"`
	Calls       int64   `json:"calls"`
	// Lease mode: where the SDK's decisions came from.
	FromLease       int64   `json:"from_lease,omitempty"`
	FromServer      int64   `json:"from_server,omitempty"`
	FromFallback    int64   `json:"from_fallback,omitempty"`
	Decisions       int64   `json:"decisions"`
	RPCsPerSec      float64 `json:"rpcs_per_sec"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	Allowed         int64   `json:"allowed"`
	Denied          int64   `json:"denied"`
	Errors          int64   `json:"errors"`
	ItemErrors      int64   `json:"item_errors"`
	FirstError      string  `json:"first_error,omitempty"`
	P50Ms           float64 `json:"p50_ms"`
	P90Ms           float64 `json:"p90_ms"`
	P99Ms           float64 `json:"p99_ms"`
	P999Ms          float64 `json:"p999_ms"`
	MaxMs           float64 `json:"max_ms"`
	MeanMs          float64 `json:"mean_ms"`
}

func newBenchCmd(a *app) *cobra.Command {
	var o benchOpts
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
			if err := o.validate(); err != nil {
				return err
			}
			res, err := a.bench(cmd, o)
			if err != nil {
				return err
			}
			if a.json() {
				if err := writeJSONLine(a.stdout, res); err != nil {
					return err
				}
			} else if err := res.writeTable(a.stdout); err != nil {
				return err
			}
			if res.Calls > 0 && res.Errors == res.Calls {
				return fmt.Errorf("bench: all %d calls failed: %s", res.Calls, res.FirstError)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.mode, "mode", modeUnary, "unary, batch, lease or bare")
	fl.Int64Var(&o.leaseMax, "lease-max", 0, "lease mode: most tokens per lease (0: the rule's lease.max_batch)")
	fl.DurationVar(&o.leaseTTL, "lease-ttl", 0, "lease mode: lease lifetime (0: the rule's lease.ttl)")
	fl.StringVar(&o.rule, "rule", "", "the rule to acquire under (required for unary and batch)")
	fl.IntVar(&o.concurrency, "concurrency", 64, "goroutines calling concurrently")
	fl.IntVar(&o.keys, "keys", 1000, "distinct keys, chosen at random per item")
	fl.DurationVar(&o.duration, "duration", 10*time.Second, "how long to load the server")
	fl.IntVar(&o.batch, "batch", 100, "items per AcquireTokens call (batch mode; at most 1000)")
	fl.IntVar(&o.conns, "conns", 1, "gRPC connections to spread the goroutines over")
	fl.Int64Var(&o.permits, "permits", 1, "permits per item")
	fl.StringVar(&o.keyPrefix, "key-prefix", "bench-", "prefix of the keys (key-prefix + number)")
	return cmd
}

func (o *benchOpts) validate() error {
	switch o.mode {
	case modeUnary, modeBatch, modeLease:
		if o.rule == "" {
			return usagef("--rule is required in %s mode", o.mode)
		}
	case modeBare:
	default:
		return usagef("--mode must be unary, batch, lease or bare, got %q", o.mode)
	}
	switch {
	case o.concurrency < 1:
		return usagef("--concurrency must be >= 1, got %d", o.concurrency)
	case o.keys < 1:
		return usagef("--keys must be >= 1, got %d", o.keys)
	case o.duration <= 0:
		return usagef("--duration must be > 0, got %v", o.duration)
	case o.batch < 1 || o.batch > maxBenchBatch:
		return usagef("--batch must be between 1 and %d, got %d", maxBenchBatch, o.batch)
	case o.conns < 1:
		return usagef("--conns must be >= 1, got %d", o.conns)
	case o.permits < 0:
		return usagef("--permits must be >= 0, got %d", o.permits)
	}
	return nil
}

// benchWorker is one calling goroutine's state. The counters are atomic so
// that the progress line can read them; only the worker writes them.
type benchWorker struct {
	calls, errors, allowed, denied, itemErrors atomic.Int64
	firstErr                                   error
	hist                                       histogram
	_                                          [64]byte // keep workers' counters on their own cache lines
}

// bench runs the load and returns the summary.
func (a *app) bench(cmd *cobra.Command, o benchOpts) (*benchResult, error) {
	// The generator runs with the servers' GC target (unless GOGC is set),
	// the same in every mode, so that it is not what limits the figures.
	if _, set := os.LookupEnv("GOGC"); !set {
		defer debug.SetGCPercent(debug.SetGCPercent(400))
	}
	conns := make([]*grpc.ClientConn, o.conns)
	for i := range conns {
		c, err := a.dial()
		if err != nil {
			return nil, err
		}
		defer c.Close()
		conns[i] = c
	}
	setup, cancel := a.context(cmd, 0)
	defer cancel()
	var rule *pb.Rule
	if o.mode != modeBare {
		err := a.call(setup, fmt.Sprintf("bench: get rule %q", o.rule), func(ctx context.Context) (err error) {
			rule, err = pb.NewAdminServiceClient(conns[0]).GetRule(ctx, &pb.GetRuleRequest{Name: o.rule})
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	// Connect every connection before the clock starts.
	for i, c := range conns {
		err := a.call(setup, fmt.Sprintf("bench: connect %d", i+1), func(ctx context.Context) error {
			_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
			if o.mode != modeBare && status.Code(err) == codes.Unimplemented {
				return nil
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	keys := make([]string, o.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%d", o.keyPrefix, i)
	}
	if rule != nil {
		a.logf("bench: %s mode, rule %s (%s, limit %d per %s), %d callers over %d connection(s), %d keys, for %v",
			o.mode, rule.GetName(), algorithmName(rule.GetAlgorithm()), rule.GetLimit(), fmtDur(rule.GetPeriod()), o.concurrency, o.conns, o.keys, o.duration)
	} else {
		a.logf("bench: bare mode (grpc.health.v1.Health/Check), %d callers over %d connection(s), for %v", o.concurrency, o.conns, o.duration)
	}

	var sdk *leaseBench
	if o.mode == modeLease {
		var err error
		if sdk, err = a.newLeaseBench(setup, o, rule); err != nil {
			return nil, err
		}
		defer sdk.close()
	}

	// The load stops when stop is set after --duration; the context is a
	// backstop for a call that hangs, and ends early on an interrupt.
	load, cancelLoad := context.WithTimeout(cmd.Context(), o.duration+a.timeout)
	defer cancelLoad()
	var stop atomic.Bool
	workers := make([]*benchWorker, o.concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range workers {
		w := new(benchWorker)
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sdk != nil {
				sdk.run(w, load, o, keys, uint64(i), &stop)
				return
			}
			w.run(load, conns[i%len(conns)], o, keys, uint64(i), &stop)
		}()
	}
	timer := time.AfterFunc(o.duration, func() { stop.Store(true) })
	defer timer.Stop()
	defer context.AfterFunc(load, func() { stop.Store(true) })()
	progressDone := make(chan struct{})
	allDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		a.progress(o, workers, start, allDone)
	}()
	wg.Wait()
	elapsed := time.Since(start)
	close(allDone)
	<-progressDone
	res := summarize(a, o, workers, elapsed)
	if sdk != nil {
		sdk.report(res, elapsed)
	}
	return res, nil
}

// run makes calls until stop is set or ctx ends.
func (w *benchWorker) run(ctx context.Context, conn *grpc.ClientConn, o benchOpts, keys []string, seed uint64, stop *atomic.Bool) {
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	permits := o.permits
	var (
		method     string
		req, resp  proto.Message
		prepare    func()
		account    func()
		unaryReq   *pb.AcquireTokenRequest
		unaryResp  *pb.AcquireTokenResponse
		batchReq   *pb.AcquireTokensRequest
		batchResp  *pb.AcquireTokensResponse
		batchItems []pb.AcquireTokenRequest
	)
	switch o.mode {
	case modeUnary:
		method = pb.TokenService_AcquireToken_FullMethodName
		unaryReq = &pb.AcquireTokenRequest{Rule: o.rule, Permits: &permits}
		unaryResp = new(pb.AcquireTokenResponse)
		req, resp = unaryReq, unaryResp
		prepare = func() { unaryReq.Key = keys[rng.IntN(len(keys))] }
		account = func() {
			if unaryResp.GetAllowed() {
				w.allowed.Add(1)
			} else {
				w.denied.Add(1)
			}
		}
	case modeBatch:
		method = pb.TokenService_AcquireTokens_FullMethodName
		batchItems = make([]pb.AcquireTokenRequest, o.batch)
		batchReq = &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, o.batch)}
		for j := range batchItems {
			batchItems[j].Rule = o.rule
			batchItems[j].Permits = &permits
			batchReq.Requests[j] = &batchItems[j]
		}
		batchResp = new(pb.AcquireTokensResponse)
		req, resp = batchReq, batchResp
		prepare = func() {
			for j := range batchItems {
				batchItems[j].Key = keys[rng.IntN(len(keys))]
			}
		}
		account = func() {
			var allowed, denied, bad int64
			for _, r := range batchResp.GetResults() {
				switch {
				case r.GetStatus() != nil && r.GetStatus().GetCode() != 0:
					bad++
					if w.firstErr == nil {
						w.firstErr = status.ErrorProto(r.GetStatus())
					}
				case r.GetResponse().GetAllowed():
					allowed++
				default:
					denied++
				}
			}
			w.allowed.Add(allowed)
			w.denied.Add(denied)
			w.itemErrors.Add(bad)
		}
	default: // modeBare
		method = healthpb.Health_Check_FullMethodName
		req, resp = &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}
		prepare, account = func() {}, func() {}
	}
	for !stop.Load() {
		prepare()
		t0 := time.Now()
		err := conn.Invoke(ctx, method, req, resp)
		lat := time.Since(t0)
		if err != nil && ctx.Err() != nil {
			return // interrupted, or a call outlived the backstop: not a result
		}
		w.hist.record(int64(lat))
		w.calls.Add(1)
		if err != nil {
			w.errors.Add(1)
			if w.firstErr == nil {
				w.firstErr = err
			}
			continue
		}
		account()
	}
}

// progress writes a line to stderr every second until done is closed.
func (a *app) progress(o benchOpts, workers []*benchWorker, start time.Time, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastCalls, lastDecisions int64
	last := start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			var calls, decisions, errs int64
			for _, w := range workers {
				calls += w.calls.Load()
				errs += w.errors.Load() + w.itemErrors.Load()
				decisions += w.allowed.Load() + w.denied.Load()
			}
			if o.mode == modeBare {
				decisions = calls - errs
			}
			dt := now.Sub(last).Seconds()
			a.logf("bench: %4.0fs  calls %d  rpc/s %.0f  decisions/s %.0f  errors %d",
				now.Sub(start).Seconds(), calls, float64(calls-lastCalls)/dt, float64(decisions-lastDecisions)/dt, errs)
			lastCalls, lastDecisions, last = calls, decisions, now
		}
	}
}

// summarize merges the workers into the result.
func summarize(a *app, o benchOpts, workers []*benchWorker, elapsed time.Duration) *benchResult {
	res := &benchResult{Mode: o.mode, Server: a.server, Concurrency: o.concurrency, Conns: o.conns, Keys: o.keys, DurationSec: round(elapsed.Seconds(), 3)}
	if o.mode != modeBare {
		res.Rule = o.rule
	} else {
		res.Keys = 0
	}
	if o.mode == modeBatch {
		res.Batch = o.batch
	}
	var h histogram
	for _, w := range workers {
		h.merge(&w.hist)
		res.Calls += w.calls.Load()
		res.Errors += w.errors.Load()
		res.ItemErrors += w.itemErrors.Load()
		res.Allowed += w.allowed.Load()
		res.Denied += w.denied.Load()
		if res.FirstError == "" && w.firstErr != nil {
			st := status.Convert(w.firstErr)
			res.FirstError = fmt.Sprintf("%s: %s", st.Code(), st.Message())
		}
	}
	res.Decisions = res.Allowed + res.Denied
	if o.mode == modeBare {
		res.Decisions = res.Calls - res.Errors
	}
	sec := elapsed.Seconds()
	res.RPCsPerSec = round(float64(res.Calls-res.Errors)/sec, 1)
	res.DecisionsPerSec = round(float64(res.Decisions)/sec, 1)
	ms := func(ns int64) float64 { return round(float64(ns)/1e6, 4) }
	res.P50Ms = ms(h.quantile(0.5))
	res.P90Ms = ms(h.quantile(0.9))
	res.P99Ms = ms(h.quantile(0.99))
	res.P999Ms = ms(h.quantile(0.999))
	res.MaxMs = ms(h.quantile(1))
	res.MeanMs = round(h.mean()/1e6, 4)
	if res.Errors+res.ItemErrors > 0 {
		a.logf("bench: %d failed calls, %d failed items; first: %s", res.Errors, res.ItemErrors, res.FirstError)
	}
	return res
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func (r *benchResult) writeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, args...)...)
	}
	row("mode", "%s", r.Mode)
	row("server", "%s", r.Server)
	if r.Rule != "" {
		row("rule", "%s", r.Rule)
	}
	load := fmt.Sprintf("%d callers over %d connection(s)", r.Concurrency, r.Conns)
	if r.Mode != modeBare {
		load += fmt.Sprintf(", %d keys", r.Keys)
	}
	if r.Batch > 0 {
		load += fmt.Sprintf(", %d items per call", r.Batch)
	}
	row("load", "%s", load)
	row("duration", "%.3fs", r.DurationSec)
	row("calls", "%d", r.Calls)
	row("errors", "%d calls, %d items", r.Errors, r.ItemErrors)
	row("rpc/s", "%.1f", r.RPCsPerSec)
	row("decisions/s", "%.1f", r.DecisionsPerSec)
	if r.Mode != modeBare {
		row("allowed", "%d", r.Allowed)
		row("denied", "%d", r.Denied)
	}
	if r.Mode == modeLease {
		row("decided by", "lease %d, server %d, fallback %d", r.FromLease, r.FromServer, r.FromFallback)
	}
	row("latency", "p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  mean %s",
		fmtMs(r.P50Ms), fmtMs(r.P90Ms), fmtMs(r.P99Ms), fmtMs(r.P999Ms), fmtMs(r.MaxMs), fmtMs(r.MeanMs))
	return tw.Flush()
}

func fmtMs(ms float64) string {
	return time.Duration(ms * 1e6).Round(time.Microsecond).String()
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
			if a.json() {
				err = writeJSONLine(a.stdout, map[string]string{"addr": lis.Addr().String()})
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

// Package loadgen loads a tokenserver with acquires (or bare gRPC calls, or
// the client SDK with leases) and summarizes throughput and latency.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/client"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Modes of a run.
const (
	ModeUnary = "unary" // one AcquireToken per call
	ModeBatch = "batch" // Options.Batch items per AcquireTokens call
	ModeBare  = "bare"  // grpc.health.v1.Health/Check: gRPC's own cost
	ModeLease = "lease" // the client SDK with leases: Allow served locally
)

// MaxBatch is the server's limit of items per AcquireTokens call.
const MaxBatch = 1000

// Options says what load to send.
type Options struct {
	// Mode is ModeUnary, ModeBatch, ModeBare or ModeLease.
	Mode string
	// Rule is the rule acquired under (all modes but ModeBare).
	Rule string
	// Concurrency is the number of calling goroutines.
	Concurrency int
	// Keys is the number of distinct keys, chosen at random per item.
	Keys int
	// Duration is how long the load lasts.
	Duration time.Duration
	// Batch is the items per AcquireTokens call (ModeBatch).
	Batch int
	// Conns is the number of gRPC connections the goroutines share
	// (reported only; the caller dials them).
	Conns int
	// Permits is the permits per item.
	Permits int64
	// KeyPrefix is the keys' prefix (KeyPrefix + number).
	KeyPrefix string
	// LeaseMax and LeaseTTL are the SDK limiter's lease settings
	// (ModeLease; 0 takes the rule's).
	LeaseMax int64
	LeaseTTL time.Duration
}

// Validate checks the options; its messages name tokenctl bench's flags.
func (o *Options) Validate() error {
	switch o.Mode {
	case ModeUnary, ModeBatch, ModeLease:
		if o.Rule == "" {
			return fmt.Errorf("--rule is required in %s mode", o.Mode)
		}
	case ModeBare:
	default:
		return fmt.Errorf("--mode must be unary, batch, lease or bare, got %q", o.Mode)
	}
	switch {
	case o.Concurrency < 1:
		return fmt.Errorf("--concurrency must be >= 1, got %d", o.Concurrency)
	case o.Keys < 1:
		return fmt.Errorf("--keys must be >= 1, got %d", o.Keys)
	case o.Duration <= 0:
		return fmt.Errorf("--duration must be > 0, got %v", o.Duration)
	case o.Batch < 1 || o.Batch > MaxBatch:
		return fmt.Errorf("--batch must be between 1 and %d, got %d", MaxBatch, o.Batch)
	case o.Conns < 1:
		return fmt.Errorf("--conns must be >= 1, got %d", o.Conns)
	case o.Permits < 0:
		return fmt.Errorf("--permits must be >= 0, got %d", o.Permits)
	}
	return nil
}

// Target is where the load goes.
type Target struct {
	// Server names the server in the Result.
	Server string
	// Conns carry the calls of ModeUnary, ModeBatch and ModeBare; worker i
	// uses Conns[i%len(Conns)].
	Conns []*grpc.ClientConn
	// Limiter serves ModeLease's calls (built with client.WithLease).
	Limiter *client.Limiter
	// Metrics is the registry the Limiter's client reports to
	// (client.WithMetrics): ModeLease's RPC count comes from it.
	Metrics prometheus.Gatherer
	// Logf receives a progress line every second and a note on failures
	// (nil: none).
	Logf func(format string, args ...any)
}

// Result is a run's summary; its JSON is one line.
type Result struct {
	Mode        string  `json:"mode"`
	Server      string  `json:"server"`
	Rule        string  `json:"rule,omitempty"`
	Concurrency int     `json:"concurrency"`
	Conns       int     `json:"conns"`
	Keys        int     `json:"keys,omitempty"`
	Batch       int     `json:"batch,omitempty"`
	DurationSec float64 `json:"durationSec"`
	Calls       int64   `json:"calls"`
	// Lease mode: where the SDK's decisions came from.
	FromLease       int64   `json:"fromLease,omitempty"`
	FromServer      int64   `json:"fromServer,omitempty"`
	FromFallback    int64   `json:"fromFallback,omitempty"`
	Decisions       int64   `json:"decisions"`
	RPCsPerSec      float64 `json:"rpcsPerSec"`
	DecisionsPerSec float64 `json:"decisionsPerSec"`
	Allowed         int64   `json:"allowed"`
	Denied          int64   `json:"denied"`
	Errors          int64   `json:"errors"`
	ItemErrors      int64   `json:"itemErrors"`
	FirstError      string  `json:"firstError,omitempty"`
	P50Ms           float64 `json:"p50Ms"`
	P90Ms           float64 `json:"p90Ms"`
	P99Ms           float64 `json:"p99Ms"`
	P999Ms          float64 `json:"p999Ms"`
	MaxMs           float64 `json:"maxMs"`
	MeanMs          float64 `json:"meanMs"`
}

// worker is one calling goroutine's state. The counters are atomic so
// that the progress line can read them; only the worker writes them.
type worker struct {
	calls, errors, allowed, denied, itemErrors atomic.Int64
	firstErr                                   error
	hist                                       histogram
	_                                          [64]byte // keep workers' counters on their own cache lines
}

// Run sends the load for o.Duration and returns the summary. ctx is a
// backstop for a call that hangs and ends the run early (an interrupt);
// calls cut short by it are not counted. Calls are not retried: failures
// count as errors.
func Run(ctx context.Context, t Target, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	switch {
	case o.Mode == ModeLease && t.Limiter == nil:
		return nil, errors.New("loadgen: lease mode needs a Limiter")
	case o.Mode != ModeLease && len(t.Conns) == 0:
		return nil, fmt.Errorf("loadgen: %s mode needs a connection", o.Mode)
	}
	logf := t.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	keys := make([]string, o.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%d", o.KeyPrefix, i)
	}
	var lease *leaseRun
	if o.Mode == ModeLease {
		lease = &leaseRun{lim: t.Limiter}
	}
	var stop atomic.Bool
	workers := make([]*worker, o.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range workers {
		w := new(worker)
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			if lease != nil {
				lease.run(ctx, w, o, keys, uint64(i), &stop)
				return
			}
			w.run(ctx, t.Conns[i%len(t.Conns)], o, keys, uint64(i), &stop)
		}()
	}
	timer := time.AfterFunc(o.Duration, func() { stop.Store(true) })
	defer timer.Stop()
	defer context.AfterFunc(ctx, func() { stop.Store(true) })()
	progressDone := make(chan struct{})
	allDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		progress(logf, o, workers, start, allDone)
	}()
	wg.Wait()
	elapsed := time.Since(start)
	close(allDone)
	<-progressDone
	res := summarize(logf, t.Server, o, workers, elapsed)
	if lease != nil {
		lease.report(res, t.Metrics, elapsed)
	}
	return res, nil
}

// run makes calls until stop is set or ctx ends.
func (w *worker) run(ctx context.Context, conn *grpc.ClientConn, o Options, keys []string, seed uint64, stop *atomic.Bool) {
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	permits := o.Permits
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
	switch o.Mode {
	case ModeUnary:
		method = pb.TokenService_AcquireToken_FullMethodName
		unaryReq = &pb.AcquireTokenRequest{Rule: o.Rule, Permits: &permits}
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
	case ModeBatch:
		method = pb.TokenService_AcquireTokens_FullMethodName
		batchItems = make([]pb.AcquireTokenRequest, o.Batch)
		batchReq = &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, o.Batch)}
		for j := range batchItems {
			batchItems[j].Rule = o.Rule
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
	default: // ModeBare
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
func progress(logf func(string, ...any), o Options, workers []*worker, start time.Time, done <-chan struct{}) {
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
			if o.Mode == ModeBare {
				decisions = calls - errs
			}
			dt := now.Sub(last).Seconds()
			logf("bench: %4.0fs  calls %d  rpc/s %.0f  decisions/s %.0f  errors %d",
				now.Sub(start).Seconds(), calls, float64(calls-lastCalls)/dt, float64(decisions-lastDecisions)/dt, errs)
			lastCalls, lastDecisions, last = calls, decisions, now
		}
	}
}

// summarize merges the workers into the result.
func summarize(logf func(string, ...any), server string, o Options, workers []*worker, elapsed time.Duration) *Result {
	res := &Result{Mode: o.Mode, Server: server, Concurrency: o.Concurrency, Conns: o.Conns, Keys: o.Keys, DurationSec: round(elapsed.Seconds(), 3)}
	if o.Mode != ModeBare {
		res.Rule = o.Rule
	} else {
		res.Keys = 0
	}
	if o.Mode == ModeBatch {
		res.Batch = o.Batch
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
	if o.Mode == ModeBare {
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
		logf("bench: %d failed calls, %d failed items; first: %s", res.Errors, res.ItemErrors, res.FirstError)
	}
	return res
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// WriteTable writes the summary as a table of "name: value" rows.
func (r *Result) WriteTable(w io.Writer) error {
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
	if r.Mode != ModeBare {
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
	if r.Mode != ModeBare {
		row("allowed", "%d", r.Allowed)
		row("denied", "%d", r.Denied)
	}
	if r.Mode == ModeLease {
		row("decided by", "lease %d, server %d, fallback %d", r.FromLease, r.FromServer, r.FromFallback)
	}
	row("latency", "p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  mean %s",
		fmtMs(r.P50Ms), fmtMs(r.P90Ms), fmtMs(r.P99Ms), fmtMs(r.P999Ms), fmtMs(r.MaxMs), fmtMs(r.MeanMs))
	return tw.Flush()
}

func fmtMs(ms float64) string {
	return time.Duration(ms * 1e6).Round(time.Microsecond).String()
}

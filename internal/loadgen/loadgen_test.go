package loadgen

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func valid() Options {
	return Options{Mode: ModeUnary, Rule: "r", Concurrency: 1, Keys: 1, Duration: time.Second, Batch: 1, Conns: 1, Permits: 1}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Options)
		want   string // "" for valid
	}{
		{"valid", func(*Options) {}, ""},
		{"bare needs no rule", func(o *Options) { o.Mode, o.Rule = ModeBare, "" }, ""},
		{"unknown mode", func(o *Options) { o.Mode = "fast" }, "--mode"},
		{"rule required", func(o *Options) { o.Rule = "" }, "--rule"},
		{"concurrency", func(o *Options) { o.Concurrency = 0 }, "--concurrency"},
		{"keys", func(o *Options) { o.Keys = 0 }, "--keys"},
		{"duration", func(o *Options) { o.Duration = 0 }, "--duration"},
		{"batch above the cap", func(o *Options) { o.Batch = MaxBatch + 1 }, "--batch"},
		{"conns", func(o *Options) { o.Conns = 0 }, "--conns"},
		{"negative permits", func(o *Options) { o.Permits = -1 }, "--permits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := valid()
			tc.change(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestRunBare loads a health server with bare calls and checks the
// summary's arithmetic.
func TestRunBare(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	o := Options{Mode: ModeBare, Concurrency: 2, Keys: 1, Duration: 200 * time.Millisecond, Batch: 1, Conns: 1}
	res, err := Run(context.Background(), Target{Server: "s", Conns: []*grpc.ClientConn{conn}}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Calls == 0 || res.Errors != 0 || res.Decisions != res.Calls || res.Keys != 0 || res.Rule != "" {
		t.Errorf("Run = %+v, want error-free calls that count as decisions", res)
	}
	if res.P50Ms <= 0 || res.P50Ms > res.MaxMs {
		t.Errorf("latency p50 %v, max %v", res.P50Ms, res.MaxMs)
	}
	var b strings.Builder
	if err := res.WriteTable(&b); err != nil || !strings.Contains(b.String(), "rpc/s:") {
		t.Errorf("WriteTable: %v\n%s", err, b.String())
	}
	if _, err := Run(context.Background(), Target{}, o); err == nil {
		t.Error("Run without a connection: nil error")
	}
}

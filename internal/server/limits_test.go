package server

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func quotaSubject(err error) string {
	for _, d := range status.Convert(err).Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.GetViolations()) > 0 {
			return q.GetViolations()[0].GetSubject()
		}
	}
	return ""
}

// TestListRulesPages: ListRules pages by page_size and page_token, in name
// order, for the leader's and the local copy; a bad token is
// InvalidArgument.
func TestListRulesPages(t *testing.T) {
	tn := newTestNode(t, nil)
	for i := range 25 {
		tn.put(t, tokenBucket(fmt.Sprintf("r%02d", i), 3))
	}
	for _, local := range []bool{false, true} {
		var names []string
		token, pages := "", 0
		for {
			resp, err := tn.admin.ListRules(ctx(t), &pb.ListRulesRequest{Local: local, PageSize: 10, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, r := range resp.GetRules() {
				names = append(names, r.GetName())
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		if pages != 3 || len(names) != 25 || names[0] != "r00" || names[24] != "r24" {
			t.Fatalf("local=%v: %d pages, %d rules %v", local, pages, len(names), names)
		}
	}
	resp, err := tn.admin.ListRules(ctx(t), &pb.ListRulesRequest{})
	if err != nil || len(resp.GetRules()) != 25 || resp.GetNextPageToken() != "" {
		t.Fatalf("default page: %d rules, next %q, %v", len(resp.GetRules()), resp.GetNextPageToken(), err)
	}
	_, err = tn.admin.ListRules(ctx(t), &pb.ListRulesRequest{PageToken: "!!"})
	wantCode(t, err, codes.InvalidArgument, "page_token")
}

// TestMaxRules: a new rule past --max-rules is ResourceExhausted with a
// QuotaFailure for the cluster; changing an existing rule still works.
func TestMaxRules(t *testing.T) {
	tn := newTestNode(t, func(c *Config) { c.MaxRules = 3 })
	for i := range 3 {
		tn.put(t, tokenBucket(fmt.Sprint("r", i), 3))
	}
	_, err := tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("r3", 3)})
	wantCode(t, err, codes.ResourceExhausted, "above the cluster's limit of 3 rules")
	if s := quotaSubject(err); s != "cluster" {
		t.Fatalf("QuotaFailure subject %q, want cluster", s)
	}
	tn.put(t, tokenBucket("r0", 5))
}

// TestBucketMemoryExhausted: at --max-bucket-memory a new key gets
// ResourceExhausted with a QuotaFailure for the node (sliding windows of
// 1000 sub-windows cost about 8 KB a key).
func TestBucketMemoryExhausted(t *testing.T) {
	tn := newTestNode(t, func(c *Config) { c.MaxBucketMemory = 1 << 20 })
	for _, name := range []string{"sw", "other"} {
		tn.put(t, &pb.Rule{Name: name, Algorithm: pb.Algorithm_SLIDING_WINDOW, Limit: 10, Period: durationpb.New(time.Second), SampleCount: 1000})
	}
	var err error
	keys := 0
	for ; keys < 1000 && err == nil; keys++ {
		_, err = tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "sw", Key: fmt.Sprint("k", keys)})
	}
	wantCode(t, err, codes.ResourceExhausted, "bucket memory budget")
	if keys < 90 || keys > 130 || quotaSubject(err) != "node" {
		t.Fatalf("refused after %d keys of ~8 KB under 1 MiB (subject %q)", keys, quotaSubject(err))
	}
	// The other rule still gets new keys: the flood is held to its share.
	if _, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "other", Key: "k"}); err != nil {
		t.Fatalf("another rule's new key during the flood: %v", err)
	}
	if b := tn.node.Buckets().Bytes(); b > 1<<20 {
		t.Fatalf("%d bytes counted, above the 1 MiB budget", b)
	}
}

// TestBadInputAnswered: values past what the arithmetic holds and partial
// on an all-or-nothing algorithm are InvalidArgument naming the field.
func TestBadInputAnswered(t *testing.T) {
	tn := newTestNode(t, nil)
	long := &durationpb.Duration{Seconds: math.MaxInt64 / 2}
	for _, tc := range []struct {
		name string
		rule *pb.Rule
		want string
	}{
		{"limit MaxInt64", &pb.Rule{Name: "a", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: math.MaxInt64, Period: durationpb.New(time.Second)}, "limit 9223372036854775807 is above"},
		{"period past int64 ns", &pb.Rule{Name: "a", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Period: long}, "period"},
		{"period 1000 years", &pb.Rule{Name: "a", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Period: &durationpb.Duration{Seconds: 1000 * 365 * 86400}}, "above the longest supported duration"},
		{"penalty 292 years", &pb.Rule{Name: "a", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Period: durationpb.New(time.Second), Penalty: long}, "penalty"},
		{"warmup past int64 ns", &pb.Rule{Name: "a", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Period: durationpb.New(time.Second), Warmup: long}, "warmup"},
	} {
		_, err := tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tc.rule})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		} else {
			wantCode(t, err, codes.InvalidArgument, tc.want)
		}
	}
	tn.put(t, &pb.Rule{Name: "log", Algorithm: pb.Algorithm_SLIDING_LOG, Limit: 5, Period: durationpb.New(time.Second)})
	_, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "log", Key: "k", Permits: p(2), Partial: true})
	wantCode(t, err, codes.InvalidArgument, "partial")
}

// TestPanicsCounted: the interceptors turn a panic into Internal and count
// it in tokenserver_panics_total.
func TestPanicsCounted(t *testing.T) {
	tn := newTestNode(t, nil)
	n := tn.node
	_, err := n.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Unary"}, func(context.Context, any) (any, error) {
		panic("boom")
	})
	wantCode(t, err, codes.Internal, "internal error in /x/Unary")
	err = n.recoverStream(nil, nil, &grpc.StreamServerInfo{FullMethod: "/x/Stream"}, func(any, grpc.ServerStream) error {
		var m map[string]int
		m["x"] = 1 //nolint:staticcheck // SA5000 on purpose: a runtime panic
		return nil
	})
	wantCode(t, err, codes.Internal, "internal error in /x/Stream")
	if got := testutil.ToFloat64(n.metrics.panics); got != 2 {
		t.Fatalf("tokenserver_panics_total = %v, want 2", got)
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1024", 1024, true}, {"256MiB", 256 << 20, true}, {"1GiB", 1 << 30, true},
		{"64 KiB", 64 << 10, true}, {"2G", 2 << 30, true}, {"3mb", 3 << 20, true}, {"1TiB", 1 << 40, true},
		{"", 0, false}, {"-1", 0, false}, {"1.5GiB", 0, false}, {"5PiB", 0, false}, {"9999999999999GiB", 0, false}, {"GiB", 0, false},
	} {
		got, err := ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok {
			if back, err := ParseBytes(FormatBytes(got)); err != nil || back != got {
				t.Errorf("FormatBytes(%d) = %q does not read back", got, FormatBytes(got))
			}
		}
	}
}

package server

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func TestTopKeysAndSeries(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("api", 5))
	// hot takes 8 (5 admitted, 3 denied), warm 3, cold 1.
	for _, k := range []struct {
		key string
		n   int
	}{{"hot", 8}, {"warm", 3}, {"cold", 1}} {
		for range k.n {
			if _, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: k.key}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name   string
		req    *pb.TopKeysRequest
		keys   []string
		counts []int64
	}{
		{"admitted", &pb.TopKeysRequest{Rule: "api"}, []string{"hot", "warm", "cold"}, []int64{5, 3, 1}},
		{"admitted top 1", &pb.TopKeysRequest{Rule: "api", N: 1}, []string{"hot"}, []int64{5}},
		{"denied", &pb.TopKeysRequest{Rule: "api", Denied: true}, []string{"hot"}, []int64{3}},
		{"hour", &pb.TopKeysRequest{Rule: "api", Window: pb.TopKeysWindow_HOUR}, []string{"hot", "warm", "cold"}, []int64{5, 3, 1}},
		{"local", &pb.TopKeysRequest{Rule: "api", Local: true}, []string{"hot", "warm", "cold"}, []int64{5, 3, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := tn.admin.TopKeys(ctx(t), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetKeys()) != len(tc.keys) {
				t.Fatalf("keys %v, want %v", resp.GetKeys(), tc.keys)
			}
			for i, k := range resp.GetKeys() {
				if k.GetKey() != tc.keys[i] || k.GetCount() != tc.counts[i] || k.GetError() != 0 {
					t.Errorf("key %d = %v, want %s count %d error 0", i, k, tc.keys[i], tc.counts[i])
				}
			}
		})
	}
	// The minute window forgets after it passes; the hour keeps.
	tn.advance(2 * time.Minute)
	if resp, err := tn.admin.TopKeys(ctx(t), &pb.TopKeysRequest{Rule: "api"}); err != nil || len(resp.GetKeys()) != 0 {
		t.Errorf("minute window after 2 min: %v, %v; want no keys", resp.GetKeys(), err)
	}
	if resp, err := tn.admin.TopKeys(ctx(t), &pb.TopKeysRequest{Rule: "api", Window: pb.TopKeysWindow_HOUR}); err != nil || len(resp.GetKeys()) != 3 {
		t.Errorf("hour window after 2 min: %v, %v; want 3 keys", resp.GetKeys(), err)
	}

	s, err := tn.admin.RuleSeries(ctx(t), &pb.RuleSeriesRequest{Rule: "api"})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GetPoints()) != 300 {
		t.Fatalf("%d points, want 300 (5 minutes)", len(s.GetPoints()))
	}
	var admitted, denied, permits int64
	var util float64
	for _, p := range s.GetPoints() {
		admitted += p.GetAdmitted()
		denied += p.GetDenied()
		permits += p.GetPermits()
		util = max(util, p.GetUtilisation())
	}
	if admitted != 9 || denied != 3 || permits != 9 || util != 9.0/5 {
		t.Errorf("series sums admitted %d denied %d permits %d max utilisation %v, want 9, 3, 9, 1.8", admitted, denied, permits, util)
	}
}

func TestVisibilityErrors(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("api", 5))
	_, err := tn.admin.TopKeys(ctx(t), &pb.TopKeysRequest{Rule: "nope"})
	wantCode(t, err, codes.NotFound, "nope")
	_, err = tn.admin.TopKeys(ctx(t), &pb.TopKeysRequest{Rule: "api", N: -1})
	wantCode(t, err, codes.InvalidArgument, "n must be")
	_, err = tn.admin.RuleSeries(ctx(t), &pb.RuleSeriesRequest{Rule: "api", FromUnix: 10, ToUnix: 5})
	wantCode(t, err, codes.InvalidArgument, "after")

	off := newTestNode(t, func(c *Config) { c.Visibility = false })
	off.put(t, tokenBucket("api", 5))
	_, err = off.admin.TopKeys(ctx(t), &pb.TopKeysRequest{Rule: "api"})
	wantCode(t, err, codes.Unavailable, "visibility is off")
}

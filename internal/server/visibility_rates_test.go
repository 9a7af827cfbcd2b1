package server

import (
	"errors"
	"testing"
	"time"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestRuleRatesCache: within ruleRatesTTL the cached answer is reused
// (one fetch for many page loads); past it, or after a failed fetch, or
// when the clock goes back, the rates are fetched again.
func TestRuleRatesCache(t *testing.T) {
	var c ruleRatesCache
	fetches := 0
	failNext := false
	fetch := func() (*pb.ListRuleRatesResponse, error) {
		fetches++
		if failNext {
			failNext = false
			return nil, errors.New("peer down")
		}
		return &pb.ListRuleRatesResponse{WindowSeconds: 10, Rates: []*pb.RuleRate{{Rule: "api", Admitted: int64(fetches)}}}, nil
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		name        string
		at          time.Duration
		fail        bool
		wantErr     bool
		wantFetches int
		wantAPI     int64
	}{
		{"first load fetches", 0, false, false, 1, 1},
		{"within the TTL: cached", 500 * time.Millisecond, false, false, 1, 1},
		{"just before the TTL: cached", ruleRatesTTL - time.Nanosecond, false, false, 1, 1},
		{"at the TTL: fetched", ruleRatesTTL, false, false, 2, 2},
		{"a failed fetch", 3 * ruleRatesTTL, true, true, 3, 0},
		{"after a failure: the old answer is stale, fetched", 3 * ruleRatesTTL, false, false, 4, 4},
		{"clock went back: fetched", 2 * ruleRatesTTL, false, false, 5, 5},
	}
	for _, st := range steps {
		failNext = st.fail
		rates, window, _, err := c.get(t0.Add(st.at), fetch)
		if (err != nil) != st.wantErr || fetches != st.wantFetches {
			t.Fatalf("%s: err %v after %d fetches, want error %v after %d", st.name, err, fetches, st.wantErr, st.wantFetches)
		}
		if st.wantErr {
			continue
		}
		if window != 10 || rates["api"].GetAdmitted() != st.wantAPI {
			t.Fatalf("%s: window %d api %v, want 10 and %d", st.name, window, rates["api"], st.wantAPI)
		}
	}
}

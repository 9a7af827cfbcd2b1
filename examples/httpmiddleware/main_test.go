package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/client"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Three requests a minute per user: the fourth gets 429 with Retry-After;
// another user is not affected.
func TestAnswers429OnceTheLimitIsHit(t *testing.T) {
	tc := testcluster.New(t, 1)
	ctx := context.Background()
	if _, err := tc.Leader().Admin().PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{
		Name: "per-user", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: 3, Period: durationpb.New(time.Minute),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}}}); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(ctx, []string{tc.Nodes[0].GRPCAddr}, client.WithCallTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := newHandler(c.Limiter("per-user"))
	get := func(user string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/?user="+user, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for i := 0; i < 3; i++ {
		if w := get("alice"); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
	}
	w := get("alice")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d, want 429", w.Code)
	}
	if ra := w.Header().Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("Retry-After = %q", ra)
	} else {
		t.Logf("429 with Retry-After: %s", ra)
	}
	if w := get("bob"); w.Code != http.StatusOK {
		t.Errorf("another user: %d", w.Code)
	}
}

func TestRetryAfterRoundsUp(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "1", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", 59500 * time.Millisecond: "60"} {
		if got := retryAfter(d); got != want {
			t.Errorf("retryAfter(%v) = %s, want %s", d, got, want)
		}
	}
}

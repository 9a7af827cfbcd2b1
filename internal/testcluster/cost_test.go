package testcluster

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// day is a token bucket that refills nothing within a test.
func day(name string, limit int64) *pb.Rule {
	return &pb.Rule{Name: name, Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: limit, Period: durationpb.New(24 * time.Hour)}
}

func putRules(t *testing.T, c *Cluster, rules ...*pb.Rule) {
	t.Helper()
	for _, r := range rules {
		if _, err := c.Leader().Admin().PutRule(ctx(t), &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatal(err)
		}
		c.WaitForRule(r.GetName())
	}
}

// TestInlineLimitAcrossNodes: a request's limit judges the key on its
// owner, whichever node the call enters by, alone or in a batch; a rule
// without an inline policy refuses it with InvalidArgument through the
// forwarding too.
func TestInlineLimitAcrossNodes(t *testing.T) {
	c := New(t, 3)
	llm := day("llm", 1000)
	llm.Inline = &pb.InlinePolicy{MaxLimit: 10, MaxPeriod: durationpb.New(24 * time.Hour)}
	putRules(t, c, llm, day("plain", 1000))
	owner := c.Nodes[1]
	key := c.KeyOwnedBy(owner.ID, "tenant")
	limit := &pb.InlineLimit{Limit: 5}
	allowed := 0
	for i := range 8 {
		via := c.Nodes[[]int{0, 2}[i%2]]
		r, err := via.Token().AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "llm", Key: key, Limit: limit})
		if err != nil {
			t.Fatalf("acquire via %s: %v", via.ID, err)
		}
		if r.GetAllowed() {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("%d allowed under a request limit of 5 (the rule's is 1000)", allowed)
	}
	// A batch through a node that owns none of the keys: the forwarded
	// items keep their limits.
	key2 := c.KeyOwnedBy(c.Nodes[2].ID, "tenant")
	var req pb.AcquireTokensRequest
	for range 4 {
		req.Requests = append(req.Requests, &pb.AcquireTokenRequest{Rule: "llm", Key: key2, Limit: &pb.InlineLimit{Limit: 3}})
	}
	req.Requests = append(req.Requests,
		&pb.AcquireTokenRequest{Rule: "llm", Key: key2, Limit: &pb.InlineLimit{Limit: 11}},
		&pb.AcquireTokenRequest{Rule: "plain", Key: key2, Limit: &pb.InlineLimit{Limit: 3}})
	resp, err := c.Nodes[0].Token().AcquireTokens(ctx(t), &req)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, r := range resp.GetResults()[:4] {
		if r.GetResponse().GetAllowed() {
			got++
		}
	}
	if got != 3 {
		t.Fatalf("batch: %d of 4 allowed under a limit of 3", got)
	}
	for i, r := range resp.GetResults()[4:] {
		if codes.Code(r.GetStatus().GetCode()) != codes.InvalidArgument {
			t.Fatalf("refused item %d: %v, want InvalidArgument", i, r)
		}
	}
	if _, err := c.Nodes[0].Token().AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "plain", Key: key, Limit: limit}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a limit under a rule without an inline policy: %v", err)
	}
}

// TestAllOrNothingAcrossOwners: org, team and user budgets on three
// different owners, 16 goroutines sending all-or-nothing batches of the
// three levels through every node. No level goes over its limit, and once
// the dust settles every bucket holds exactly its limit less what the
// granted batches took: every refused batch gave back what it had
// reserved.
func TestAllOrNothingAcrossOwners(t *testing.T) {
	c := New(t, 3)
	user := day("user", 1000)
	user.Inline = &pb.InlinePolicy{MaxLimit: 10, MaxPeriod: durationpb.New(24 * time.Hour)}
	putRules(t, c, day("org", 50), day("team", 1000), user)
	org := c.KeyOwnedBy(c.Nodes[0].ID, "org")
	teams := []string{c.KeyOwnedBy(c.Nodes[1].ID, "team-a"), c.KeyOwnedBy(c.Nodes[1].ID, "team-b")}
	teamLimit := map[string]int64{teams[0]: 20, teams[1]: 40}
	var users []string
	for i := range 8 {
		users = append(users, c.KeyOwnedBy(c.Nodes[2].ID, fmt.Sprint("user", i)))
	}
	// Team limits by override, the user limit from the request.
	for k, l := range teamLimit {
		if _, err := c.Leader().Admin().PutOverride(ctx(t), &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: "team", Key: k, Limit: l}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		c.WaitFor("overrides everywhere", func() bool { return n.Cluster().Table().Get("team").Runtime().Len() == 2 })
	}
	var (
		mu       sync.Mutex
		byUser   = map[string]int64{}
		byTeam   = map[string]int64{}
		total    atomic.Int64
		refused  atomic.Int64
		wg       sync.WaitGroup
		failures = make(chan error, 16)
	)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				u := users[(g+i)%len(users)]
				team := teams[(g+i)%len(users)/4]
				via := c.Nodes[(g+i)%3]
				resp, err := via.Token().AcquireTokens(ctx(t), &pb.AcquireTokensRequest{AllOrNothing: true, Requests: []*pb.AcquireTokenRequest{
					{Rule: "org", Key: org},
					{Rule: "team", Key: team},
					{Rule: "user", Key: u, Limit: &pb.InlineLimit{Limit: 10}},
				}})
				if err != nil {
					failures <- err
					return
				}
				n := 0
				for _, r := range resp.GetResults() {
					if r.GetStatus().GetCode() != 0 {
						failures <- fmt.Errorf("item error: %v", r.GetStatus())
						return
					}
					if r.GetResponse().GetAllowed() {
						n++
					}
				}
				switch n {
				case 3:
					total.Add(1)
					mu.Lock()
					byUser[u]++
					byTeam[team]++
					mu.Unlock()
				case 0:
					refused.Add(1)
				default:
					failures <- fmt.Errorf("%d of 3 items granted in an all-or-nothing batch", n)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Fatal(err)
	}
	if total.Load() > 50 {
		t.Fatalf("org: %d granted over its limit of 50", total.Load())
	}
	for k, n := range byTeam {
		if n > teamLimit[k] {
			t.Fatalf("team %s: %d granted over its limit of %d", k, n, teamLimit[k])
		}
	}
	for k, n := range byUser {
		if n > 10 {
			t.Fatalf("user %s: %d granted over its limit of 10", k, n)
		}
	}
	if refused.Load() == 0 || total.Load() == 0 {
		t.Fatalf("%d granted, %d refused: the test did not bind", total.Load(), refused.Load())
	}
	// Exact accounting: what is left is the limit less what was granted.
	zero := int64(0)
	left := func(rule, key string, l *pb.InlineLimit) int64 {
		r, err := c.Nodes[0].Token().AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: rule, Key: key, Permits: &zero, Limit: l})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetRemaining()
	}
	if got := left("org", org, nil); got != 50-total.Load() {
		t.Fatalf("org: %d left, want %d: a refused batch kept its reservation", got, 50-total.Load())
	}
	for k, l := range teamLimit {
		if got := left("team", k, nil); got != l-byTeam[k] {
			t.Fatalf("team %s: %d left, want %d", k, got, l-byTeam[k])
		}
	}
	for _, u := range users {
		if got := left("user", u, &pb.InlineLimit{Limit: 10}); got != 10-byUser[u] {
			t.Fatalf("user %s: %d left, want %d", u, got, 10-byUser[u])
		}
	}
	t.Logf("%d batches granted, %d refused; by team %v", total.Load(), refused.Load(), byTeam)
}

// TestAllOrNothingRefusesPartial: partial grants and leases cannot be
// all-or-nothing; the batch is refused before anything is decided.
func TestAllOrNothingRefusesPartial(t *testing.T) {
	c := New(t, 1)
	putRules(t, c, day("org", 5))
	_, err := c.Nodes[0].Token().AcquireTokens(ctx(t), &pb.AcquireTokensRequest{AllOrNothing: true, Requests: []*pb.AcquireTokenRequest{
		{Rule: "org", Key: "a"}, {Rule: "org", Key: "b", Partial: true},
	}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("partial in an all-or-nothing batch: %v", err)
	}
	zero := int64(0)
	if r, err := c.Nodes[0].Token().AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "org", Key: "a", Permits: &zero}); err != nil || r.GetRemaining() != 5 {
		t.Fatalf("after a refused batch: %v %v; want 5 left", r, err)
	}
}

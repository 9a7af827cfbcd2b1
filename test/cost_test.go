//go:build multiprocess

package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/client"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Cost accounting under load (issue 17): 16 goroutines reserve random
// estimates on 50 keys against 3 tokenserver processes for 10 s and
// commit random usage up to twice the estimate.
const (
	costWorkers  = 16
	costKeys     = 50
	costDuration = 10 * time.Second
	costMaxEst   = 20
	// exactLimit is the per-key limit of the rule whose totals are
	// checked: a day's fixed window, so that nothing resets during the run.
	exactLimit = 600
	// windowLimit is the per-key limit of the 1 s window rule whose
	// per-window admission is checked.
	windowLimit = 100
)

// costTally is what the load did to one key of the exact rule.
type costTally struct {
	mu        sync.Mutex
	committed int64               // permits the commits settled at
	last      *client.Reservation // a settled reservation, to read the key's state back
}

// TestCostReserveCommitExact: the total the servers charged each key equals
// the total the clients committed, exactly; and the cost charged to a key's
// window never passes the limit plus one largest overrun.
//
// Reading the servers' side: a commit of a reservation already settled
// changes nothing and answers the key's current state, so re-committing
// each key's last reservation at the end reads remaining and debt from the
// key's owner. A fixed window holds limit - remaining + debt. The check
// fails if a commit is lost, applied twice, given back or debited wrongly,
// or a grant is charged that the client never learnt of.
//
// The window bound holds for one outstanding reservation per key: a grant
// needs held + estimate <= limit, so only the commit of the last grant can
// push the window past the limit, by its overrun; further grants wait
// until the window rolls. With k reservations of a key outstanding at
// once the bound is the limit plus k overruns, so the window rule's
// workers hold a key's lock from Reserve to Commit. The exact rule's
// workers do not: totals must be exact under any concurrency.
func TestCostReserveCommitExact(t *testing.T) {
	c := newProcCluster(t, 3)
	waitOffDayBoundary(t)
	c.putRuleEverywhere(&pb.Rule{Name: "cost-exact", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: exactLimit,
		Period: durationpb.New(24 * time.Hour), Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})
	c.putRuleEverywhere(&pb.Rule{Name: "cost-window", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: windowLimit,
		Period: durationpb.New(time.Second), Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sdk, err := client.New(ctx, []string{c.grpc[c.ids[1]]}, client.WithCallTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	exact, window := sdk.Limiter("cost-exact"), sdk.Limiter("cost-window")

	tallies := make([]costTally, costKeys)
	keyLocks := make([]sync.Mutex, costKeys)
	var (
		maxOverrun, maxHeld                atomic.Int64
		grants, denials, debts, unknown    atomic.Int64
		windowGrants, windowDebts, expired atomic.Int64
		errMu                              sync.Mutex
		firstErr                           error
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	raise := func(a *atomic.Int64, v int64) {
		for {
			old := a.Load()
			if v <= old || a.CompareAndSwap(old, v) {
				return
			}
		}
	}
	// commit settles r, retrying while the owner cannot be reached (a
	// commit is idempotent, so a retry never charges twice).
	commit := func(r *client.Reservation, used int64) (client.Settlement, error) {
		for {
			s, err := r.CommitContext(ctx, used)
			if !errors.Is(err, client.ErrUnavailable) || ctx.Err() != nil {
				return s, err
			}
		}
	}
	deadline := time.Now().Add(costDuration)
	var wg sync.WaitGroup
	for w := 0; w < costWorkers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 17))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				k := rng.IntN(costKeys)
				key := "tenant-" + strconv.Itoa(k)
				est := 1 + rng.Int64N(costMaxEst)
				used := rng.Int64N(2*est + 1)

				// The exact rule: any number of reservations of a key at once.
				r, err := exact.Reserve(ctx, key, est)
				var de *client.DeniedError
				switch {
				case errors.As(err, &de):
					denials.Add(1)
				case err != nil:
					unknown.Add(1)
					fail(fmt.Errorf("reserve %s: %w (its outcome on the server is unknown)", key, err))
				default:
					grants.Add(1)
					s, err := commit(r, used)
					if err != nil {
						fail(fmt.Errorf("commit %s: %w", key, err))
						break
					}
					if s.Debt > 0 {
						debts.Add(1)
					}
					tl := &tallies[k]
					tl.mu.Lock()
					tl.committed += used
					tl.last = r
					tl.mu.Unlock()
				}

				// The window rule: one reservation of a key at a time.
				keyLocks[k].Lock()
				r, err = window.Reserve(ctx, key, est)
				switch {
				case errors.As(err, &de):
				case err != nil:
					fail(fmt.Errorf("reserve %s in the window rule: %w", key, err))
				default:
					windowGrants.Add(1)
					raise(&maxHeld, windowLimit-r.Decision().Remaining)
					raise(&maxOverrun, used-est)
					s, err := commit(r, used)
					switch {
					case errors.Is(err, client.ErrReservationNotFound):
						expired.Add(1) // past its 1 s TTL: charged at its estimate
					case err != nil:
						fail(fmt.Errorf("commit %s in the window rule: %w", key, err))
					default:
						raise(&maxHeld, windowLimit-s.Remaining+s.Debt)
						if s.Debt > 0 {
							windowDebts.Add(1)
						}
					}
				}
				keyLocks[k].Unlock()
			}
		}(uint64(w))
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	t.Logf("exact rule: %d grants, %d denials, %d commits into debt; window rule: %d grants, %d commits into debt, %d expired; largest overrun %d, most held in a window %d (limit %d)",
		grants.Load(), denials.Load(), debts.Load(), windowGrants.Load(), windowDebts.Load(), expired.Load(), maxOverrun.Load(), maxHeld.Load(), windowLimit)

	// The run must have reached the edges it checks.
	if denials.Load() == 0 || debts.Load() == 0 || windowDebts.Load() == 0 {
		t.Fatalf("the load never reached debt or a denial (denials %d, debts %d, window debts %d): the checks would prove nothing",
			denials.Load(), debts.Load(), windowDebts.Load())
	}

	// Exact: what each owner charged equals what was committed.
	var totalCommitted, totalCharged int64
	for k := range tallies {
		tl := &tallies[k]
		if tl.last == nil {
			t.Fatalf("tenant-%d: no reservation was ever granted", k)
		}
		s, err := commit(tl.last, 0) // settled already: reads the state, changes nothing
		if err != nil {
			t.Fatalf("tenant-%d: reading the state back: %v", k, err)
		}
		charged := exactLimit - s.Remaining + s.Debt
		if charged != tl.committed {
			t.Errorf("tenant-%d: the owner charged %d (remaining %d, debt %d), the clients committed %d", k, charged, s.Remaining, s.Debt, tl.committed)
		}
		totalCommitted += tl.committed
		totalCharged += charged
	}
	t.Logf("exact rule: %d permits committed, %d charged by the owners", totalCommitted, totalCharged)
	if totalCharged != totalCommitted {
		t.Errorf("total charged %d != total committed %d", totalCharged, totalCommitted)
	}

	// Per window: within the limit plus one largest overrun.
	if bound := windowLimit + maxOverrun.Load(); maxHeld.Load() > bound {
		t.Errorf("a window held %d permits, above the limit %d plus the largest overrun %d", maxHeld.Load(), windowLimit, maxOverrun.Load())
	}
}

// waitOffDayBoundary waits, if need be, until the UTC day (the exact
// rule's window) has more than 3 minutes left: its totals must not be
// split across two windows.
func waitOffDayBoundary(t *testing.T) {
	t.Helper()
	left := 24*time.Hour - time.Duration(time.Now().UnixNano()%int64(24*time.Hour))
	if left < 3*time.Minute {
		t.Logf("waiting %v for the next UTC day", left)
		time.Sleep(left + time.Second)
	}
}

// TestTokenctlOverridesAndCalendar: tokenctl sets, lists and deletes a
// runtime override through a follower, the override decides at once on
// the key's owner, and a --calendar month --time-zone Europe/Berlin rule
// resets at the next Berlin month.
func TestTokenctlOverridesAndCalendar(t *testing.T) {
	c := newProcCluster(t, 3)
	leader := c.leader("")
	follower := c.ids[0]
	if follower == leader {
		follower = c.ids[1]
	}
	addr := c.grpc[follower]
	ctlJSON(t, addr, "rule", "put", "llm", "--algorithm", "token-bucket", "--limit", "10", "--period", "1h")

	o := ctlJSON(t, addr, "override", "set", "llm", "premium-*", "--limit", "500", "--expires", "1h")
	if o["key"] != "premium-*" || o["limit"] != "500" || o["expiresUnixNs"] == nil {
		t.Fatalf("override set: %v", o)
	}
	ctlJSON(t, addr, "override", "set", "llm", "premium-acme", "--limit", "50", "--burst", "70")
	l := ctlJSON(t, addr, "override", "list", "llm")
	list, _ := l["overrides"].([]any)
	if len(list) != 2 {
		t.Fatalf("override list: %v", l)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peek := func(key string) int64 {
		zero := int64(0)
		resp, err := c.token(follower).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "llm", Key: key, Permits: &zero})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetRemaining()
	}
	// Every node applies the overrides: the exact key beats the prefix.
	c.waitFor("the overrides on every owner", 30*time.Second, func() bool {
		return peek("premium-acme") == 70 && peek("premium-zed") == 500 && peek("basic-1") == 10
	})

	if _, errs, code := ctl(t, addr, "override", "delete", "llm", "premium-*"); code != 0 {
		t.Fatalf("override delete: exit %d: %s", code, errs)
	}
	c.waitFor("the prefix override gone everywhere", 30*time.Second, func() bool {
		return peek("premium-zed") == 10 && peek("premium-acme") == 70
	})
	if _, errs, code := ctl(t, addr, "override", "set", "llm", "a*b", "--limit", "5"); code == 0 || errs == "" {
		t.Errorf("override set of a bad pattern: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := ctl(t, addr, "override", "set", "llm", "k"); code != 2 || !strings.Contains(errs, "--limit") {
		t.Errorf("override set without --limit: exit %d, stderr %q; want exit 2 naming --limit", code, errs)
	}

	// A calendar month in Berlin, without --period.
	r := ctlJSON(t, addr, "rule", "put", "monthly", "--algorithm", "fixed-window", "--limit", "1000", "--calendar", "month", "--time-zone", "Europe/Berlin")
	if r["calendar"] != "MONTH" || r["timeZone"] != "Europe/Berlin" {
		t.Fatalf("rule put --calendar: %v", r)
	}
	if _, errs, code := ctl(t, addr, "rule", "put", "bad", "--algorithm", "fixed-window", "--limit", "1", "--calendar", "month", "--time-zone", "Mars/Olympus"); code != 2 || !strings.Contains(errs, "--time-zone") {
		t.Errorf("rule put with an unknown zone: exit %d, stderr %q; want exit 2 naming --time-zone", code, errs)
	}
	c.waitFor("the calendar rule on "+follower, 30*time.Second, func() bool {
		_, err := c.admin(follower).GetRule(ctx, &pb.GetRuleRequest{Name: "monthly", Local: true})
		return err == nil
	})
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	a := ctlJSON(t, addr, "acquire", "monthly", "tenant", "--permits", "3")
	now := time.Now().In(berlin)
	next := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, berlin)
	resetNs, _ := a["resetAfterNs"].(float64) // JSON numbers decode as float64
	if want := next.Sub(now); a["allowed"] != float64(1) || absDur(time.Duration(resetNs)-want) > 5*time.Second {
		t.Errorf("acquire on the Berlin month: %v; reset after %v, want about %v (to %v)", a, time.Duration(resetNs), want, next)
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

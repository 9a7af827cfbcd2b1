//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/envoyrls"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// envoyEdge is the domain of the multi-process RLS tests. LOAD is the
// limit of the "load" descriptor, the one the ConfigMap swap changes.
const envoyEdge = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 20
  - key: path
    value: /login
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit:
          unit: hour
          requests_per_unit: 2
  - key: load
    rate_limit:
      unit: hour
      requests_per_unit: LOAD
`

// configMap is a directory laid out as Kubernetes mounts a ConfigMap: the
// files of each version in a timestamped directory, "..data" a symlink to
// the current one, and each file a symlink through "..data".
type configMap struct {
	t       *testing.T
	dir     string
	version int
}

func newConfigMap(t *testing.T, files map[string]string) *configMap {
	m := &configMap{t: t, dir: t.TempDir()}
	m.swap(files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// swap writes files as a new version and points "..data" at it with an
// atomic rename, as the kubelet does.
func (m *configMap) swap(files map[string]string) {
	m.t.Helper()
	m.version++
	ts := fmt.Sprintf("..2026_11_27_00_00_%02d.%d", m.version, m.version)
	if err := os.Mkdir(filepath.Join(m.dir, ts), 0o755); err != nil {
		m.t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(m.dir, ts, name), []byte(data), 0o644); err != nil {
			m.t.Fatal(err)
		}
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
}

func edgeYAML(load int) string { return strings.Replace(envoyEdge, "LOAD", fmt.Sprint(load), 1) }

func rlsDesc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (c *procCluster) rls(id string) rlpb.RateLimitServiceClient {
	return rlpb.NewRateLimitServiceClient(c.conns[id])
}

// addressesOwned returns, for each member, n remote_address values whose
// counters it owns (the hash key of a descriptor is domain_key_value_).
func (c *procCluster) addressesOwned(prefix string, n int) map[string][]string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Ownership is computed over a view that lists every node: right after
	// the cluster forms, a node's view may not have them all yet.
	var view *pb.ClusterView
	for {
		v, err := c.token(c.ids[0]).GetClusterView(ctx, &pb.GetClusterViewRequest{})
		if err != nil {
			c.t.Fatal(err)
		}
		if len(v.GetMembers()) == len(c.ids) {
			view = v
			break
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("the view lists %d of %d nodes after 5s", len(v.GetMembers()), len(c.ids))
		case <-time.After(50 * time.Millisecond):
		}
	}
	out := map[string][]string{}
	for i, done := 0, 0; done < len(view.GetMembers()); i++ {
		v := fmt.Sprintf("%s%d", prefix, i)
		o := ownerOf(view, "edge_remote_address_"+v+"_")
		if len(out[o]) < n {
			out[o] = append(out[o], v)
			if len(out[o]) == n {
				done++
			}
		}
	}
	return out
}

// normalizeRLS drops duration_until_reset, which depends on the instant of
// each call.
func normalizeRLS(r *rlpb.RateLimitResponse) *rlpb.RateLimitResponse {
	r = proto.Clone(r).(*rlpb.RateLimitResponse)
	for _, s := range r.Statuses {
		if s.DurationUntilReset != nil {
			s.DurationUntilReset = durationpb.New(0)
		}
	}
	return r
}

// TestEnvoyRLSProcesses runs three tokenserver processes on one
// ConfigMap-style --envoy-config-dir and drives them with a Go client of
// RLS v3: descriptors owned by the three nodes, sent through one node,
// answer as envoyrls.MemDecider answers the same files and requests;
// tokenctl envoy list shows the domain with its author and source; a
// "..data" swap under load changes the limit on every node within a bound
// and no call fails; kill -9 of a node under load keeps each moved counter
// within one fresh window (2×limit admitted), the others within the limit,
// and no call through a survivor fails.
func TestEnvoyRLSProcesses(t *testing.T) {
	cm := newConfigMap(t, map[string]string{"edge.yaml": edgeYAML(100000)})
	if err := os.WriteFile(filepath.Join(cm.dir, ".edge.yaml.swp"), []byte("\x00 not yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newProcCluster(t, 3, "--envoy-config-dir", cm.dir, "--envoy-config-poll", "100ms")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The domain reaches every node; tokenctl shows its author and source.
	for _, id := range c.ids {
		c.waitFor("domain edge on "+id, 20*time.Second, func() bool {
			resp, err := c.admin(id).ListEnvoyDomains(ctx, &pb.ListEnvoyDomainsRequest{Local: true})
			return err == nil && len(resp.GetDomains()) == 1
		})
	}
	list := ctlJSON(t, c.grpc[c.ids[1]], "envoy", "list")
	ds, _ := list["domains"].([]any)
	if len(ds) != 1 {
		t.Fatalf("tokenctl envoy list: %v", list)
	}
	d0, _ := ds[0].(map[string]any)
	if d0["domain"] != "edge" || d0["author"] != "file:edge.yaml" || d0["source"] != "edge.yaml" {
		t.Fatalf("tokenctl envoy list: %v, want domain edge by file:edge.yaml from edge.yaml", d0)
	}
	out, errs, code := ctl(t, c.grpc[c.ids[2]], "envoy", "list")
	if code != 0 || !strings.Contains(out, "edge") || !strings.Contains(out, "file:edge.yaml") {
		t.Fatalf("tokenctl envoy list: exit %d\n%s%s", code, out, errs)
	}

	t.Run("conformance", func(t *testing.T) { envoyConformance(t, c, cm, ctx) })
	t.Run("configmap swap under load", func(t *testing.T) { envoySwap(t, c, cm, ctx) })
	t.Run("kill -9 under load", func(t *testing.T) { envoyKill(t, c, ctx) })
}

func envoyConformance(t *testing.T, c *procCluster, cm *configMap, ctx context.Context) {
	cfg, err := envoyrls.LoadDir(cm.dir)
	if err != nil {
		t.Fatal(err)
	}
	ref := envoyrls.NewService(func() *envoyrls.Config { return cfg }, envoyrls.NewMemDecider(), envoyrls.Options{})
	owned := c.addressesOwned("10.0.1.", 1)
	var descs []*ratelimitv3.RateLimitDescriptor
	for _, id := range c.ids {
		descs = append(descs, rlsDesc("remote_address", owned[id][0]))
	}
	descs = append(descs, rlsDesc("path", "/login"), rlsDesc("tenant", "a", "plan", "free"), rlsDesc("unknown", "x"))
	through := c.ids[0]
	for i := 0; i < 25; i++ {
		req := &rlpb.RateLimitRequest{Domain: "edge", Descriptors: descs}
		if i%5 == 4 {
			req.HitsAddend = 2
		}
		got, err := c.rls(through).ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("call %d through %s: %v", i, through, err)
		}
		want, err := ref.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(normalizeRLS(got), normalizeRLS(want)) {
			t.Fatalf("call %d through %s:\n got %v\nwant %v", i, through, got, want)
		}
	}
}

func envoySwap(t *testing.T, c *procCluster, cm *configMap, ctx context.Context) {
	const newLimit = 7
	lctx, stop := context.WithCancel(ctx)
	var calls, failed atomic.Int64
	// switched[id] is when node id first answered with the new limit;
	// regressed counts old-limit answers after that.
	var mu sync.Mutex
	switched := map[string]time.Time{}
	var regressed atomic.Int64
	var wg sync.WaitGroup
	for w, id := range c.ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; lctx.Err() == nil; i++ {
				req := &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("load", fmt.Sprintf("w%d-%d", w, i%50))}}
				cctx, cancel := context.WithTimeout(lctx, 5*time.Second)
				resp, err := c.rls(id).ShouldRateLimit(cctx, req)
				cancel()
				if lctx.Err() != nil {
					return
				}
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("call through %s: %v", id, err)
					continue
				}
				lim := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
				mu.Lock()
				_, ok := switched[id]
				if lim == newLimit && !ok {
					switched[id] = time.Now()
				} else if lim != newLimit && ok {
					regressed.Add(1)
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	swapped := time.Now()
	cm.swap(map[string]string{"edge.yaml": edgeYAML(newLimit)})
	const bound = 10 * time.Second
	c.waitFor("the new limit on every node", bound, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(switched) == len(c.ids)
	})
	time.Sleep(500 * time.Millisecond)
	stop()
	wg.Wait()
	var slowest time.Duration
	for _, at := range switched {
		slowest = max(slowest, at.Sub(swapped))
	}
	t.Logf("swap: %d calls, %d failed; the new limit on every node %v after the swap; %d old answers after a node switched", calls.Load(), failed.Load(), slowest.Round(time.Millisecond), regressed.Load())
	if failed.Load() != 0 || regressed.Load() != 0 {
		t.Fatalf("%d calls failed, %d answered the old limit after the new one", failed.Load(), regressed.Load())
	}
}

func envoyKill(t *testing.T, c *procCluster, ctx context.Context) {
	const limit = 20 // remote_address: 20 per hour
	leader := c.leader("")
	victim := ""
	for _, id := range c.ids {
		if id != leader {
			victim = id
			break
		}
	}
	owned := c.addressesOwned("10.0.2.", 4)
	var keys []string
	moved := map[string]bool{}
	for id, vs := range owned {
		keys = append(keys, vs...)
		for _, v := range vs {
			moved[v] = id == victim
		}
	}
	var through []string
	for _, id := range c.ids {
		if id != victim {
			through = append(through, id)
		}
	}
	lctx, stop := context.WithCancel(ctx)
	var mu sync.Mutex
	admitted := map[string]int{}
	var calls, failed atomic.Int64
	var wg sync.WaitGroup
	for w, id := range through {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; lctx.Err() == nil; i++ {
				// Two descriptors per call, so that a call fans out.
				a, b := keys[i%len(keys)], keys[(i+3)%len(keys)]
				req := &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("remote_address", a), rlsDesc("remote_address", b)}}
				cctx, cancel := context.WithTimeout(lctx, 5*time.Second)
				resp, err := c.rls(id).ShouldRateLimit(cctx, req)
				cancel()
				if lctx.Err() != nil {
					return
				}
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				for j, v := range []string{a, b} {
					if resp.GetStatuses()[j].GetCode() == rlpb.RateLimitResponse_OK {
						admitted[v]++
					}
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	c.waitFor("every counter at its limit", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if admitted[k] < limit {
				return false
			}
		}
		return true
	})
	c.kill(victim)
	killed := time.Now()
	// Load until the survivors see the victim down and well after.
	c.waitFor("the victim out of the live view", 30*time.Second, func() bool { return c.liveCount() == len(c.ids)-1 })
	time.Sleep(2 * time.Second)
	stop()
	wg.Wait()
	t.Logf("kill -9 %s: %d calls, %d failed, view changed %v after the kill; admitted %v (moved: %v)", victim, calls.Load(), failed.Load(), time.Since(killed).Round(time.Millisecond), admitted, moved)
	if failed.Load() != 0 {
		t.Errorf("%d of %d calls failed: the survivors should count the victim's counters at once", failed.Load(), calls.Load())
	}
	for _, k := range keys {
		bound := limit
		if moved[k] {
			bound = 2 * limit // one fresh window on the next owner
		}
		if admitted[k] > bound {
			t.Errorf("%s (moved %v): %d admitted, above the bound %d", k, moved[k], admitted[k], bound)
		}
	}
	// The survivors answer once the view has moved.
	resp, err := c.rls(through[0]).ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("remote_address", "10.0.3.1")}})
	if err != nil || resp.GetOverallCode() != rlpb.RateLimitResponse_OK {
		t.Fatalf("after the kill: %v %v", resp, err)
	}
}

// envoyDrainYAML is the domain of TestEnvoyCountersSurviveDrain: a
// fixed-window limit and one of the algorithm extension, per day.
const envoyDrainYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: day
      requests_per_unit: 20
  - key: tenant
    algorithm: token-bucket
    rate_limit:
      unit: day
      requests_per_unit: 20
`

// envoyCounter is a counter of domain edge: its descriptor key and value.
type envoyCounter struct{ key, value string }

// envoyDrainCounters starts 3 nodes serving the Envoy config yaml (domain
// edge) and returns them, a node to drain (not the leader), another to
// call through, and five counters each of remote_address and tenant
// (values prefix0, prefix1, ...) that the node to drain owns.
func envoyDrainCounters(ctx context.Context, t *testing.T, yaml, prefix string) (c *procCluster, drained, via string, counters []envoyCounter) {
	cm := newConfigMap(t, map[string]string{"edge.yaml": yaml})
	c = newProcCluster(t, 3, "--envoy-config-dir", cm.dir, "--envoy-config-poll", "100ms")
	for _, id := range c.ids {
		c.waitFor("domain edge on "+id, 20*time.Second, func() bool {
			resp, err := c.admin(id).ListEnvoyDomains(ctx, &pb.ListEnvoyDomainsRequest{Local: true})
			return err == nil && len(resp.GetDomains()) == 1
		})
	}
	leader := c.leader("")
	for _, id := range c.ids {
		if id != leader && drained == "" {
			drained = id
		} else if id != drained {
			via = id
		}
	}
	view := c.fullView(via)
	for _, key := range []string{"remote_address", "tenant"} {
		for i, n := 0, 0; n < 5; i++ {
			if v := fmt.Sprintf("%s%d", prefix, i); ownerOf(view, "edge_"+key+"_"+v+"_") == drained {
				counters = append(counters, envoyCounter{key, v})
				n++
			}
		}
	}
	return c, drained, via, counters
}

// TestEnvoyCountersSurviveDrain drains (SIGTERM) the node that owns some
// Envoy counters, half spent, under calls through another node: the
// drain hands the counters over, so each is admitted exactly its 20 a
// day across the drain. (Before, the new owner dropped handed-over Envoy
// counters, whose rules are in no rule table, and each started fresh:
// 30 of 20 here.)
func TestEnvoyCountersSurviveDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, drained, via, counters := envoyDrainCounters(ctx, t, envoyDrainYAML, "10.9.0.")
	admitted := map[envoyCounter]int{}
	hit := func(k envoyCounter) {
		t.Helper()
		resp, err := c.rls(via).ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc(k.key, k.value)}})
		if err != nil {
			t.Fatalf("ShouldRateLimit %s=%s via %s: %v", k.key, k.value, via, err)
		}
		if resp.GetOverallCode() == rlpb.RateLimitResponse_OK {
			admitted[k]++
		}
	}
	for _, k := range counters {
		for range 15 {
			hit(k)
		}
	}
	c.stop(drained)
	c.waitFor("a view of 2", 30*time.Second, func() bool { return c.liveCount() == 2 })
	for _, k := range counters {
		for range 15 {
			hit(k)
		}
	}
	for _, k := range counters {
		if admitted[k] != 20 {
			t.Errorf("%s=%s admitted %d across the drain of its owner %s, want exactly its 20 a day", k.key, k.value, admitted[k], drained)
		}
	}
	t.Logf("FIGURE envoy drain: %d counters of 20 a day, owned by the drained node, admitted %v", len(counters), admitted)
}

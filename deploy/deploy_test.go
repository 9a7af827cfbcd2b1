// Package deploy holds the Kubernetes manifests, the container image recipe
// and the Grafana dashboard; its test checks them against the code.
package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/tokenserver/tokenserver/internal/server"
)

// objects holds every manifest decoded strictly into its k8s.io/api type.
type objects struct {
	sts      []*appsv1.StatefulSet
	services []*corev1.Service
	pdbs     []*policyv1.PodDisruptionBudget
	cms      []*corev1.ConfigMap
}

func decodeAll(t *testing.T) objects {
	t.Helper()
	var o objects
	files, _ := filepath.Glob("kubernetes/*.yaml")
	if len(files) == 0 {
		t.Fatal("no manifests under kubernetes/")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s document %d: %v", f, i+1, err)
			}
			var target any
			switch meta.Kind {
			case "StatefulSet":
				s := new(appsv1.StatefulSet)
				o.sts, target = append(o.sts, s), s
			case "Service":
				s := new(corev1.Service)
				o.services, target = append(o.services, s), s
			case "PodDisruptionBudget":
				s := new(policyv1.PodDisruptionBudget)
				o.pdbs, target = append(o.pdbs, s), s
			case "ConfigMap":
				s := new(corev1.ConfigMap)
				o.cms, target = append(o.cms, s), s
			case "Kustomization":
				var k struct {
					APIVersion string   `json:"apiVersion"`
					Kind       string   `json:"kind"`
					Resources  []string `json:"resources"`
				}
				target = &k
				if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				for _, r := range k.Resources {
					if _, err := os.Stat(filepath.Join("kubernetes", r)); err != nil {
						t.Errorf("kustomization lists %s: %v", r, err)
					}
				}
				continue
			default:
				t.Fatalf("%s document %d: unexpected kind %q", f, i+1, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i+1, meta.Kind, err)
			}
		}
	}
	return o
}

// args parses "--name=value" container args.
func args(t *testing.T, list []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range list {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Fatalf("container arg %q is not --name=value", a)
		}
		out[name] = value
	}
	return out
}

func TestManifests(t *testing.T) {
	o := decodeAll(t)
	if len(o.sts) != 1 || len(o.pdbs) != 1 || len(o.cms) != 1 || len(o.services) != 2 {
		t.Fatalf("want 1 StatefulSet, 2 Services, 1 PDB, 1 ConfigMap; got %d %d %d %d", len(o.sts), len(o.services), len(o.pdbs), len(o.cms))
	}
	s := o.sts[0]
	if *s.Spec.Replicas != 3 || s.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("StatefulSet: replicas %d, policy %q; want 3 and Parallel", *s.Spec.Replicas, s.Spec.PodManagementPolicy)
	}
	pod := s.Spec.Template.Spec
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds < 15 {
		t.Error("terminationGracePeriodSeconds is too short for a leadership transfer")
	}
	if pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil {
		t.Error("no pod anti-affinity")
	}
	c := pod.Containers[0]
	a := args(t, c.Args)
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Error("readiness must probe /readyz and liveness /healthz")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("no resource requests")
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || (m.MountPath == a["data-dir"] && m.Name == s.Spec.VolumeClaimTemplates[0].Name)
	}
	if !mounted {
		t.Errorf("--data-dir=%s is not the mount of the volume claim template", a["data-dir"])
	}
	if a["bootstrap-expect"] != "3" || strings.Count(a["peers"], "=") != 3 {
		t.Errorf("bootstrap flags: --bootstrap-expect=%s --peers=%s", a["bootstrap-expect"], a["peers"])
	}
	var headless *corev1.Service
	for _, svc := range o.services {
		if svc.Name == s.Spec.ServiceName {
			headless = svc
		}
	}
	if headless == nil || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("serviceName %q must be a headless Service with publishNotReadyAddresses", s.Spec.ServiceName)
	}
	if !strings.Contains(a["advertise-raft"], "."+s.Spec.ServiceName+".") {
		t.Errorf("--advertise-raft=%s is not a name under the headless Service", a["advertise-raft"])
	}
	if p := o.pdbs[0]; p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
		t.Error("the PodDisruptionBudget must allow at most 1 unavailable")
	}
	// Every flag the StatefulSet passes is a real tokenserver flag.
	flags := serverFlags(t)
	for name := range a {
		if !flags[name] {
			t.Errorf("the StatefulSet passes --%s, which tokenserver does not have", name)
		}
	}
	if _, ok := o.cms[0].Data["rules.yaml"]; !ok {
		t.Error("the rules ConfigMap has no rules.yaml")
	}
	checkMemory(t, c, a)
}

// Memory arithmetic of a tokenserver pod (figures from BenchmarkMemoryPerKey
// and BenchmarkFloodRSS in internal/shard).
const (
	// heapPerCounted is the live heap per byte of bucket memory counted
	// against --max-bucket-memory: at most 136.8 B measured for 136 B
	// counted (1.006, every algorithm within 1 B a key), so 1.05 with
	// margin.
	heapPerCounted = 1.05
	// baseHeap is the live heap besides buckets: rule table, gRPC and Raft
	// buffers, metrics.
	baseHeap = 64 << 20
	// liveShare is how much of GOMEMLIMIT the live heap may fill so that
	// the GC (at --gc-percent 400) is not driven into back-to-back cycles.
	liveShare = 2.0 / 3
	// limitShare is how much of the container's memory limit GOMEMLIMIT may
	// be: the rest is goroutine stacks, bbolt's mmap and the runtime.
	limitShare = 0.9
)

// checkMemory checks that the bucket budget, GOMEMLIMIT and the container
// limit fit together: the live heap at a full budget stays within
// liveShare of GOMEMLIMIT, which stays within limitShare of the limit.
func checkMemory(t *testing.T, c corev1.Container, a map[string]string) {
	t.Helper()
	var goMemLimit int64
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			v, err := server.ParseBytes(e.Value)
			if err != nil {
				t.Fatalf("GOMEMLIMIT=%q: %v", e.Value, err)
			}
			goMemLimit = v
		}
	}
	if goMemLimit == 0 {
		t.Fatal("the container sets no GOMEMLIMIT")
	}
	var budget int64
	if v, ok := a["max-bucket-memory"]; ok {
		var err error
		if budget, err = server.ParseBytes(v); err != nil {
			t.Fatalf("--max-bucket-memory=%s: %v", v, err)
		}
	} else {
		budget = goMemLimit / 100 * server.BucketMemoryShare
	}
	limit := c.Resources.Limits.Memory().Value()
	live := int64(heapPerCounted*float64(budget)) + baseHeap
	t.Logf("bucket budget %d MiB -> live heap up to %d MiB; GOMEMLIMIT %d MiB; container limit %d MiB",
		budget>>20, live>>20, goMemLimit>>20, limit>>20)
	if float64(live) > liveShare*float64(goMemLimit) {
		t.Errorf("a full bucket budget of %d MiB makes a live heap of about %d MiB, above %.0f%% of GOMEMLIMIT (%d MiB)", budget>>20, live>>20, 100*liveShare, goMemLimit>>20)
	}
	if float64(goMemLimit) > limitShare*float64(limit) {
		t.Errorf("GOMEMLIMIT %d MiB is above %.0f%% of the container's memory limit %d MiB", goMemLimit>>20, 100*limitShare, limit>>20)
	}
	if _, ok := a["max-buckets"]; ok {
		t.Error("--max-buckets counts buckets, not bytes: bound the pod's memory with --max-bucket-memory")
	}
}

// serverFlags builds tokenserver and reads its flag names from --help.
func serverFlags(t *testing.T) map[string]bool {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tokenserver")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/tokenserver").CombinedOutput(); err != nil {
		t.Fatalf("build tokenserver: %v\n%s", err, out)
	}
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	flags := map[string]bool{}
	re := regexp.MustCompile(`^\s+-{1,2}([a-z0-9-]+)`)
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if !flags["grpc-addr"] {
		t.Fatalf("could not read flags from tokenserver --help:\n%s", out)
	}
	return flags
}

// TestDockerfile checks that what the Dockerfile copies and builds exists.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "COPY" && !strings.HasPrefix(f[1], "--from") {
			for _, src := range f[1 : len(f)-1] {
				if _, err := os.Stat(filepath.Join("..", src)); err != nil {
					t.Errorf("Dockerfile copies %s: %v", src, err)
				}
			}
		}
		for _, m := range regexp.MustCompile(`go build [^&]*?(\./cmd/[a-z]+)`).FindAllStringSubmatch(line, -1) {
			builds++
			if _, err := os.Stat(filepath.Join("..", m[1], "main.go")); err != nil {
				t.Errorf("Dockerfile builds %s: %v", m[1], err)
			}
		}
	}
	if builds < 2 {
		t.Errorf("Dockerfile builds %d commands, want tokenserver and tokenctl", builds)
	}
	if !strings.Contains(string(data), "USER 65532") || !strings.Contains(string(data), "nonroot") {
		t.Error("the image must run as non-root")
	}
}

// TestDashboard checks the Grafana dashboard is JSON whose queries name
// only metrics that the server exports.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile("grafana/tokenserver-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	known := metricNames(t)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, m := range metricRefs(tg.Expr) {
				if !known[m] && pendingMetric(m) == "" {
					t.Errorf("panel %q queries %s, which neither the server nor the SDK exports", p.Title, m)
				}
			}
		}
	}
}

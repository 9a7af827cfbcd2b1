//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestStatefulSetFlags runs 3 nodes with exactly the args of
// deploy/kubernetes/statefulset.yaml, the pod DNS names and 0.0.0.0 listen
// addresses swapped for 127.0.0.1 ports, and checks that they form one
// cluster that takes rule writes.
func TestStatefulSetFlags(t *testing.T) {
	data, err := os.ReadFile("../deploy/kubernetes/statefulset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sts appsv1.StatefulSet
	if err := yaml.UnmarshalStrict(data, &sts); err != nil {
		t.Fatal(err)
	}
	n := int(*sts.Spec.Replicas)
	args := sts.Spec.Template.Spec.Containers[0].Args
	// Ports per pod and per container port.
	ports := map[string]map[string]string{} // pod → "7070" → 127.0.0.1:port
	for i := 0; i < n; i++ {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		ports[pod] = map[string]string{"7070": freePort(t), "7071": freePort(t), "7072": freePort(t)}
	}
	host := regexp.MustCompile(`(` + sts.Name + `-\d+)\.` + regexp.QuoteMeta(sts.Spec.ServiceName) + `\.\$\(POD_NAMESPACE\)\.svc\.cluster\.local:(\d+)`)
	listen := regexp.MustCompile(`0\.0\.0\.0:(\d+)`)
	dir := t.TempDir()
	c := &procCluster{t: t, args: map[string][]string{}, procs: map[string]*serverProc{}, conns: map[string]*grpc.ClientConn{}, grpc: map[string]string{}}
	for i := 0; i < n; i++ {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		var out []string
		for _, a := range args {
			a = strings.ReplaceAll(a, "$(POD_NAME)", pod)
			a = host.ReplaceAllStringFunc(a, func(m string) string {
				sub := host.FindStringSubmatch(m)
				return ports[sub[1]][sub[2]]
			})
			a = listen.ReplaceAllStringFunc(a, func(m string) string { return ports[pod][listen.FindStringSubmatch(m)[1]] })
			if strings.HasPrefix(a, "--data-dir=") {
				a = "--data-dir=" + filepath.Join(dir, pod)
			}
			if strings.Contains(a, "$(") || strings.Contains(a, "svc.cluster.local") {
				t.Fatalf("arg %q still names something of Kubernetes", a)
			}
			out = append(out, a)
		}
		c.ids = append(c.ids, pod)
		c.args[pod] = append(out, fastRaft...)
		c.grpc[pod] = ports[pod]["7070"]
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.dial()
	c.waitFor("one cluster of all the pods", 60*time.Second, func() bool { return c.liveCount() == n })
	leader := c.leader("")
	for _, id := range c.ids {
		if id == leader {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.admin(id).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB("from-"+id, 10)})
		cancel()
		if err != nil {
			t.Fatalf("rule write through %s: %v", id, err)
		}
	}
	// tokenctl cluster status -o json: the fields scripts read.
	js := ctlJSON(t, c.grpc[c.ids[1]], "cluster", "status")
	// API objects print as protojson: 64-bit integers are strings.
	if js["leader"] != leader || js["epoch"] == nil || js["epoch"] == "0" {
		t.Fatalf("cluster status -o json: leader %v epoch %v, want %s and an epoch", js["leader"], js["epoch"], leader)
	}
	members, _ := js["members"].([]any)
	if len(members) != n {
		t.Fatalf("cluster status -o json: %d members", len(members))
	}
	for _, m := range members {
		mm := m.(map[string]any)
		for _, k := range []string{"id", "grpcAddr", "raftAddr", "role", "voter", "live", "appliedIndex"} {
			if _, ok := mm[k]; !ok {
				t.Fatalf("member %v lacks %q", mm, k)
			}
		}
		if mm["live"] != true || mm["appliedIndex"] == "0" {
			t.Fatalf("member %v", mm)
		}
	}
	st, err := c.status(c.ids[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.GetMembers() {
		if m.GetGrpcAddr() != ports[m.GetId()]["7070"] {
			t.Fatalf("member %s advertises %s, want %s", m.GetId(), m.GetGrpcAddr(), ports[m.GetId()]["7070"])
		}
	}
}

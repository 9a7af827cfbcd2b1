package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

const overlayDir = "overlays/tls"

// certManager is a cert-manager Issuer or Certificate, decoded into maps
// (no Go types are vendored for cert-manager's CRDs) and checked by hand.
type certManager struct {
	file string
	obj  map[string]any
}

func (c certManager) name() string { return str(c.obj, "metadata", "name") }

// str returns the string at path in m ("" when missing).
func str(m map[string]any, path ...string) string {
	v := get(m, path...)
	s, _ := v.(string)
	return s
}

func get(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

func strs(m map[string]any, path ...string) []string {
	list, _ := get(m, path...).([]any)
	var out []string
	for _, v := range list {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

// onlyKeys fails when m (at path) has keys outside allowed: the strictness
// that UnmarshalStrict gives typed objects.
func onlyKeys(t *testing.T, where string, m map[string]any, allowed ...string) {
	t.Helper()
	for k := range m {
		if !slices.Contains(allowed, k) {
			t.Errorf("%s: unknown field %q", where, k)
		}
	}
}

// overlay is the TLS overlay decoded.
type overlay struct {
	issuers, certs []certManager
	secrets        []*corev1.Secret
	policies       []*networkingv1.NetworkPolicy
	stsPatch       *appsv1.StatefulSet
}

func decodeOverlay(t *testing.T) overlay {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(overlayDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
		Patches    []struct {
			Path string `json:"path"`
		} `json:"patches"`
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("overlay kustomization: %v", err)
	}
	if !slices.Contains(k.Resources, "../../kubernetes") {
		t.Errorf("the overlay does not build on the base: resources %v", k.Resources)
	}
	files := []string{}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join(overlayDir, r)); err != nil {
			t.Errorf("kustomization lists %s: %v", r, err)
		} else if strings.HasSuffix(r, ".yaml") {
			files = append(files, r)
		}
	}
	for _, p := range k.Patches {
		files = append(files, p.Path)
	}
	var o overlay
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(overlayDir, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			where := fmt.Sprintf("%s document %d", f, i+1)
			var meta struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var target any
			switch meta.Kind {
			case "Issuer", "Certificate":
				var m map[string]any
				if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if m["apiVersion"] != "cert-manager.io/v1" {
					t.Errorf("%s: apiVersion %v, want cert-manager.io/v1", where, m["apiVersion"])
				}
				onlyKeys(t, where, m, "apiVersion", "kind", "metadata", "spec")
				c := certManager{file: f, obj: m}
				if c.name() == "" {
					t.Errorf("%s: no metadata.name", where)
				}
				if meta.Kind == "Issuer" {
					o.issuers = append(o.issuers, c)
				} else {
					o.certs = append(o.certs, c)
				}
				continue
			case "Secret":
				s := new(corev1.Secret)
				o.secrets, target = append(o.secrets, s), s
			case "NetworkPolicy":
				p := new(networkingv1.NetworkPolicy)
				o.policies, target = append(o.policies, p), p
			case "StatefulSet":
				if o.stsPatch != nil {
					t.Fatalf("%s: a second StatefulSet", where)
				}
				o.stsPatch = new(appsv1.StatefulSet)
				target = o.stsPatch
			default:
				t.Fatalf("%s: unexpected kind %q", where, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
				t.Fatalf("%s (%s): %v", where, meta.Kind, err)
			}
		}
	}
	return o
}

// TestTLSOverlay checks the TLS overlay against the base and the server:
// cert-manager objects with their required fields and a chain that ends in
// the Secret the pods mount, a node certificate naming every replica's
// node id and DNS name with server and client usages, the args of the base
// plus the TLS flags whose files are mounted, HTTPS probes, a token file
// of hashes only, and a NetworkPolicy that admits Raft from the
// StatefulSet's pods alone.
func TestTLSOverlay(t *testing.T) {
	base := decodeAll(t)
	o := decodeOverlay(t)
	sts := base.sts[0]
	replicas := int(*sts.Spec.Replicas)

	// cert-manager: Issuers and Certificates.
	issuers := map[string]certManager{}
	for _, is := range o.issuers {
		issuers[is.name()] = is
		spec, _ := is.obj["spec"].(map[string]any)
		onlyKeys(t, "Issuer "+is.name(), spec, "selfSigned", "ca")
		if len(spec) != 1 {
			t.Errorf("Issuer %s: want exactly one of selfSigned and ca, got %v", is.name(), spec)
		}
		if _, ok := spec["ca"]; ok && str(spec, "ca", "secretName") == "" {
			t.Errorf("Issuer %s: ca without secretName", is.name())
		}
	}
	caSecrets := map[string]bool{} // secrets of CA certificates
	var serving *certManager
	for i, c := range o.certs {
		where := "Certificate " + c.name()
		spec, _ := c.obj["spec"].(map[string]any)
		onlyKeys(t, where, spec, "isCA", "commonName", "secretName", "duration", "renewBefore", "privateKey", "usages", "dnsNames", "uris", "issuerRef")
		if str(spec, "secretName") == "" {
			t.Errorf("%s: no secretName", where)
		}
		ref := str(spec, "issuerRef", "name")
		if _, ok := issuers[ref]; !ok || str(spec, "issuerRef", "kind") != "Issuer" {
			t.Errorf("%s: issuerRef %s/%s is not an Issuer of the overlay", where, str(spec, "issuerRef", "kind"), ref)
		}
		if alg := str(spec, "privateKey", "algorithm"); alg != "ECDSA" {
			t.Errorf("%s: privateKey.algorithm %q, want ECDSA", where, alg)
		}
		var d, rb time.Duration
		for _, f := range []struct {
			name string
			v    *time.Duration
		}{{"duration", &d}, {"renewBefore", &rb}} {
			if s := str(spec, f.name); s != "" {
				v, err := time.ParseDuration(s)
				if err != nil {
					t.Errorf("%s: %s: %v", where, f.name, err)
				}
				*f.v = v
			}
		}
		if rb != 0 && rb >= d {
			t.Errorf("%s: renewBefore %v is not below duration %v", where, rb, d)
		}
		if get(spec, "isCA") == true {
			caSecrets[str(spec, "secretName")] = true
			continue
		}
		serving = &o.certs[i]
	}
	for _, is := range o.issuers {
		if s := str(is.obj, "spec", "ca", "secretName"); s != "" && !caSecrets[s] {
			t.Errorf("Issuer %s signs with secret %s, which no CA Certificate fills", is.name(), s)
		}
	}
	if serving == nil {
		t.Fatal("no node Certificate")
	}
	spec := serving.obj["spec"].(map[string]any)
	if str(spec, "issuerRef", "name") != "" && get(issuers[str(spec, "issuerRef", "name")].obj, "spec", "ca") == nil {
		t.Errorf("the node certificate is not signed by a CA Issuer")
	}
	usages := strs(spec, "usages")
	if !slices.Contains(usages, "server auth") || !slices.Contains(usages, "client auth") {
		t.Errorf("node certificate usages %v: a node serves and dials its peers (server auth, client auth)", usages)
	}
	uris := strs(spec, "uris")
	for i := range replicas {
		if want := fmt.Sprintf("tokenserver://node/%s-%d", sts.Name, i); !slices.Contains(uris, want) {
			t.Errorf("node certificate uris %v lack %s: pod %d would not be a peer", uris, want, i)
		}
	}
	dns := strs(spec, "dnsNames")
	peerWildcard := false
	for _, n := range dns {
		peerWildcard = peerWildcard || strings.HasPrefix(n, "*."+sts.Spec.ServiceName+".")
	}
	if !peerWildcard || !slices.Contains(dns, "tokenserver") {
		t.Errorf("node certificate dnsNames %v: want *.%s.NAMESPACE... (advertised addresses) and the client Service", dns, sts.Spec.ServiceName)
	}

	// The StatefulSet patch.
	p := o.stsPatch
	if p == nil || p.Name != sts.Name || len(p.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("the overlay must patch StatefulSet %s's one container", sts.Name)
	}
	c := p.Spec.Template.Spec.Containers[0]
	for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
		if a == "--insecure=true" {
			if slices.Contains(c.Args, a) {
				t.Error("the TLS overlay keeps the base's --insecure")
			}
			continue
		}
		if !slices.Contains(c.Args, a) {
			t.Errorf("the patch drops the base arg %s (a strategic merge replaces the list)", a)
		}
	}
	a := args(t, c.Args)
	mounts := map[string]string{} // mount path → secret name
	for _, m := range c.VolumeMounts {
		for _, v := range p.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				mounts[m.MountPath] = v.Secret.SecretName
			}
		}
	}
	secretOf := func(flag string) string {
		f := a[flag]
		if f == "" {
			t.Errorf("the overlay does not pass --%s", flag)
			return ""
		}
		s, ok := mounts[filepath.Dir(f)]
		if !ok {
			t.Errorf("--%s=%s is not in a mounted Secret", flag, f)
		}
		return s
	}
	for _, flag := range []string{"tls-cert", "tls-key", "tls-client-ca"} {
		if s := secretOf(flag); s != "" && s != str(spec, "secretName") {
			t.Errorf("--%s reads Secret %s, not the node certificate's %s", flag, s, str(spec, "secretName"))
		}
	}
	if a["tls-client-auth"] != "request" && a["tls-client-auth"] != "require" {
		t.Errorf("--tls-client-auth=%q: clients and peers need their certificates read", a["tls-client-auth"])
	}
	if tokSecret := secretOf("auth-tokens"); tokSecret != "" {
		var found bool
		for _, s := range o.secrets {
			if s.Name != tokSecret {
				continue
			}
			found = true
			file, ok := s.StringData[filepath.Base(a["auth-tokens"])]
			if !ok {
				t.Errorf("Secret %s has no key %s", s.Name, filepath.Base(a["auth-tokens"]))
			}
			for _, line := range strings.Split(file, "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "sha256:") {
					t.Errorf("the token file holds %q: only sha256: hashes belong there", line)
				}
			}
		}
		if !found {
			t.Errorf("--auth-tokens reads Secret %s, which the overlay does not define", tokSecret)
		}
	}
	for name, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("the %s probe does not speak HTTPS", name)
		}
	}
	// The flags exist, once the server has its TLS flags.
	flags := serverFlags(t)
	if !flags["tls-cert"] {
		t.Log("cmd/tokenserver has no --tls-cert yet: the overlay's flags are not checked against --help")
	} else {
		for name := range a {
			if !flags[name] {
				t.Errorf("the overlay passes --%s, which tokenserver does not have", name)
			}
		}
	}

	// The NetworkPolicy admits Raft only from the StatefulSet's pods.
	var raftPort int32
	for _, port := range sts.Spec.Template.Spec.Containers[0].Ports {
		if port.Name == "raft" {
			raftPort = port.ContainerPort
		}
	}
	if len(o.policies) != 1 {
		t.Fatalf("want 1 NetworkPolicy, got %d", len(o.policies))
	}
	np := o.policies[0]
	same := func(m map[string]string) bool {
		return fmt.Sprint(m) == fmt.Sprint(sts.Spec.Selector.MatchLabels)
	}
	if !same(np.Spec.PodSelector.MatchLabels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("the NetworkPolicy selects %v (types %v), want the StatefulSet's pods and Ingress", np.Spec.PodSelector.MatchLabels, np.Spec.PolicyTypes)
	}
	raftAdmitted := false
	for i, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			t.Errorf("ingress rule %d admits every port, Raft's included", i)
		}
		for _, port := range r.Ports {
			if port.Port == nil || port.Port.IntValue() != int(raftPort) {
				continue
			}
			raftAdmitted = true
			if len(r.From) == 0 {
				t.Errorf("ingress rule %d admits the Raft port from anywhere", i)
			}
			for _, from := range r.From {
				if from.PodSelector == nil || !same(from.PodSelector.MatchLabels) || from.NamespaceSelector != nil || from.IPBlock != nil {
					t.Errorf("ingress rule %d admits the Raft port from %+v, not only the StatefulSet's pods", i, from)
				}
			}
		}
	}
	if !raftAdmitted {
		t.Error("the NetworkPolicy does not admit the Raft port at all: peers could not talk")
	}
}

// TestTLSOverlayRenders runs kustomize (kubectl kustomize) on the overlay
// and decodes the result strictly: the patch merges into the base.
func TestTLSOverlayRenders(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed")
	}
	out, err := exec.Command(kubectl, "kustomize", overlayDir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", overlayDir, err, out)
	}
	kinds := map[string]int{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		kinds[meta.Kind]++
		if meta.Kind != "StatefulSet" {
			continue
		}
		var s appsv1.StatefulSet
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("rendered StatefulSet: %v", err)
		}
		c := s.Spec.Template.Spec.Containers[0]
		var paths []string
		for _, m := range c.VolumeMounts {
			paths = append(paths, m.MountPath)
		}
		if !slices.Contains(paths, "/data") || !slices.Contains(paths, "/etc/tokenserver/tls") {
			t.Errorf("rendered mounts %v: want the data volume and the TLS Secret", paths)
		}
		if c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.ReadinessProbe.PeriodSeconds != 2 {
			t.Errorf("rendered readiness probe %+v: want HTTPS and the base's period", c.ReadinessProbe)
		}
	}
	for kind, n := range map[string]int{"StatefulSet": 1, "NetworkPolicy": 1, "Certificate": 2, "Issuer": 2, "Secret": 1, "Service": 2} {
		if kinds[kind] != n {
			t.Errorf("rendered %d %s, want %d", kinds[kind], kind, n)
		}
	}
}

package deploy

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfileBuilds builds both binaries from exactly what the
// Dockerfile's build stage copies, in a temporary directory, with the
// Dockerfile's own go build commands (no Docker needed): a package that
// imports something the Dockerfile does not copy fails here.
func TestDockerfileBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var builds []string
	for _, line := range strings.Split(strings.ReplaceAll(string(data), "\\\n", " "), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "COPY" && !strings.HasPrefix(f[1], "--from") {
			for _, src := range f[1 : len(f)-1] {
				copyTree(t, filepath.Join("..", src), filepath.Join(dir, src))
			}
		}
		for _, m := range regexp.MustCompile(`go build [^&]*?-o (\S+) (\./cmd/[a-z]+)`).FindAllStringSubmatch(line, -1) {
			builds = append(builds, m[2])
		}
	}
	if len(builds) < 2 {
		t.Fatalf("the Dockerfile builds %v, want tokenserver and tokenctl", builds)
	}
	for _, pkg := range builds {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "out", filepath.Base(pkg)), pkg)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("go build %s from the Dockerfile's sources: %v\n%s", pkg, err, out)
		}
	}
	if out, err := exec.Command(filepath.Join(dir, "out", "tokenserver"), "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "tokenserver ") {
		t.Errorf("tokenserver --version: %v %s", err, out)
	}
}

// copyTree copies a file or a directory tree (tests' data included).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	src = strings.TrimSuffix(src, "/")
	dst = strings.TrimSuffix(dst, "/")
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}

package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/tokenserver/tokenserver/internal/grant"
)

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeClusterLoopOutsideTourData: the README's nodes keep their
// state apart from the tour's single server (--data-dir ./data), each in
// its own directory.
func TestReadmeClusterLoopOutsideTourData(t *testing.T) {
	dirs := regexp.MustCompile(`--data-dir (\S+)`).FindAllStringSubmatch(readme(t), -1)
	if len(dirs) == 0 {
		t.Fatal("no --data-dir in the README")
	}
	for _, m := range dirs {
		d := strings.TrimPrefix(m[1], "./")
		if d == "data" || strings.HasPrefix(d, "data/") {
			t.Errorf("README: --data-dir %s is inside the tour's ./data", m[1])
		}
	}
}

// TestReadmeExampleGrantIDsWellFormed: grant ids in the README are
// well-formed (grant.IDLen characters).
func TestReadmeExampleGrantIDsWellFormed(t *testing.T) {
	for _, m := range regexp.MustCompile(`--grant ([A-Za-z0-9_-]+)`).FindAllStringSubmatch(readme(t), -1) {
		if m[1] == "ID" {
			continue
		}
		if _, err := grant.Parse(m[1]); err != nil {
			t.Errorf("README: example grant id %q: %v", m[1], err)
		}
	}
}

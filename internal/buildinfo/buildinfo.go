// Package buildinfo names the running build (module version, VCS revision,
// Go version) for --version, NodeStatus and the tokenserver_build_info gauge.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"sync"
)

// Build names the running build.
type Build struct {
	// Version is the main module's version ("(devel)" for a build from a
	// checkout).
	Version string
	// Revision is the VCS revision, with "+dirty" when the tree had
	// uncommitted changes; "unknown" when the build carries none.
	Revision string
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string
}

// buildVersion, set with -ldflags -X (the Dockerfile's VERSION), names a
// build whose module version is not known to Go ("(devel)").
var buildVersion string

// Read reads the build from the binary (debug.ReadBuildInfo).
var Read = sync.OnceValue(func() Build {
	b := Build{Version: "unknown", Revision: "unknown", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.GoVersion = bi.GoVersion
	if bi.Main.Version != "" {
		b.Version = bi.Main.Version
	}
	if buildVersion != "" && (b.Version == "(devel)" || b.Version == "unknown") {
		b.Version = buildVersion
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Revision != "unknown" {
		b.Revision += "+dirty"
	}
	return b
})

// Version is the build in one line: "VERSION (REVISION, GOVERSION)".
func Version() string {
	b := Read()
	return fmt.Sprintf("%s (%s, %s)", b.Version, b.Revision, b.GoVersion)
}

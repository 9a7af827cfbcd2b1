package server

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

// BuildInfo reads the build from the binary (debug.ReadBuildInfo).
var BuildInfo = sync.OnceValue(func() Build {
	b := Build{Version: "unknown", Revision: "unknown", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.GoVersion = bi.GoVersion
	if bi.Main.Version != "" {
		b.Version = bi.Main.Version
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
	b := BuildInfo()
	return fmt.Sprintf("%s (%s, %s)", b.Version, b.Revision, b.GoVersion)
}

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tokenserver/tokenserver/internal/buildinfo"
)

// newVersionCmd is `tokenctl version`: this binary's build.
func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print tokenctl's version (module version, VCS revision, Go version)",
		Args:  argNames(),
		RunE: func(*cobra.Command, []string) error {
			b := buildinfo.Read()
			if a.json() {
				return writeJSON(a.stdout, map[string]string{"version": b.Version, "revision": b.Revision, "go_version": b.GoVersion})
			}
			_, err := fmt.Fprintln(a.stdout, "tokenctl", buildinfo.Version())
			return err
		},
	}
}

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
			if a.structured() {
				return a.write(map[string]string{"version": b.Version, "revision": b.Revision, "goVersion": b.GoVersion})
			}
			_, err := fmt.Fprintln(a.stdout, "tokenctl", buildinfo.Version())
			return err
		},
	}
}

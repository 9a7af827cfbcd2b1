// Command tokenctl drives a tokenserver by hand: it manages rules, acquires
// and refills tokens, and measures a server's throughput with bench.
//
// Results go to stdout (a table, or JSON with -o json), logs and progress to
// stderr. The exit code is 0 when the command did its work (a denial is a
// result, not an error), 2 for a usage error (a bad flag or argument) and 1
// for any other error (InvalidArgument, NotFound, an unreachable server...).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	_ "time/tzdata" // calendar windows name IANA zones; the host may lack a zone database
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes tokenctl with args and returns the exit code; an error is
// printed to stderr as "tokenctl: <message>".
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "tokenctl: %v\n", err)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return 2
	}
	return 1
}

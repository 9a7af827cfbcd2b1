package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/tokenserver/tokenserver/internal/buildinfo"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Defaults of the global flags.
const (
	defaultServer  = "127.0.0.1:7070"
	defaultTimeout = 10 * time.Second
	// serverEnv overrides the default of --server.
	serverEnv = "TOKENSERVER_ADDR"
)

// usageError is a problem with the command line: a bad flag, a missing or
// extra argument. It exits with code 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// app is what every command shares: the global flags and the output streams.
type app struct {
	stdout, stderr io.Writer
	server         string
	timeout        time.Duration
	output         string
	sec            security
}

// logf writes a log line to stderr.
func (a *app) logf(format string, args ...any) {
	fmt.Fprintf(a.stderr, "tokenctl: "+format+"\n", args...)
}

// context returns the command's context bounded by --timeout plus extra
// (the time a command is asked to run for, like acquire --duration).
func (a *app) context(cmd *cobra.Command, extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), a.timeout+extra)
}

// dial returns a client connection to --server, with TLS and a bearer
// token when the security flags say so, whose calls wait for the server and
// retry Unavailable until their deadline (rpc.go). grpc.NewClient does not
// connect: the first call does.
func (a *app) dial() (*grpc.ClientConn, error) {
	probe := newConnProbe(a.server)
	return a.dialWith(probe, a.retryDialOptions(probe)...)
}

// dialDirect is dial without waiting or retries: a call fails at once when
// the server cannot be reached (bench's load). The probe records the
// connection's TLS failures for a caller that waits (watchConn).
func (a *app) dialDirect() (*grpc.ClientConn, *connProbe, error) {
	probe := newConnProbe(a.server)
	c, err := a.dialWith(probe)
	return c, probe, err
}

// dialWith dials --server with the security flags' options and extra;
// probe, if not nil, records TLS handshake failures.
func (a *app) dialWith(probe *connProbe, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts, err := a.sec.dialOptions(probe)
	if err != nil {
		return nil, err
	}
	c, err := grpc.NewClient(a.server, append(opts, extra...)...)
	if err != nil {
		return nil, usagef("--server %q: %v", a.server, err)
	}
	return c, nil
}

// clients dials --server and returns both service clients and a close func.
func (a *app) clients() (pb.TokenServiceClient, pb.AdminServiceClient, func(), error) {
	c, err := a.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	return pb.NewTokenServiceClient(c), pb.NewAdminServiceClient(c), func() { c.Close() }, nil
}

// newRootCmd builds tokenctl's command tree writing to stdout and stderr.
// Commands return their errors instead of exiting; run maps them to exit
// codes.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "tokenctl",
		Short: "Drive a tokenserver: rules, acquire and refill by hand, bench",
		Long: `tokenctl drives a tokenserver over gRPC.

Results go to stdout, as a table or, with -o json or -o yaml, as JSON or
YAML (API objects in protojson with the proto's JSON names, as rule files
use; tokenctl's own results in the same lowerCamelCase); logs and progress
go to stderr. Calls wait for the server and are retried while it answers
Unavailable, with exponential backoff and jitter, until --timeout, the
deadline of the whole command.

Exit codes: 0 when the command did its work (a denied acquire is a result,
not an error); 1 on an error (InvalidArgument, NotFound, an unreachable
server, ...); 2 on a usage error (a bad flag or argument).`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.ArbitraryArgs,
		RunE:          groupRunE,
		// cobra's own `completion bash|zsh|fish|powershell`.
		CompletionOptions: cobra.CompletionOptions{},
		// --version prints what `tokenctl version` prints.
		Version: buildinfo.Version(),
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "table", "json", "yaml":
			default:
				return usagef("-o/--output must be table, json or yaml, got %q", a.output)
			}
			if a.timeout <= 0 {
				return usagef("--timeout must be > 0, got %v", a.timeout)
			}
			if a.server == "" {
				return usagef("--server is empty")
			}
			return nil
		},
	}
	root.SetVersionTemplate("tokenctl {{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })

	server := defaultServer
	if s := os.Getenv(serverEnv); s != "" {
		server = s
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", server, "gRPC address of a tokenserver node (env "+serverEnv+")")
	pf.DurationVar(&a.timeout, "timeout", defaultTimeout, "deadline of the whole command; calls failing with Unavailable are retried within it")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")
	a.sec.addFlags(pf)

	root.AddCommand(
		newRuleCmd(a),
		newOverrideCmd(a),
		newAcquireCmd(a),
		newRefillCmd(a),
		newCommitCmd(a),
		newLeaseCmd(a),
		newClusterCmd(a),
		newSnapshotCmd(a),
		newBenchCmd(a),
		newBenchServerCmd(a),
		newCertsCmd(a),
		newTokenCmd(a),
		newNodeCmd(a),
		newVersionCmd(a),
		newEnvoyCmd(a),
		newTopCmd(a),
	)
	return root
}

// groupRunE runs a command that only groups subcommands: without arguments
// it prints its help; with any it fails as a usage error.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usagef("%s", msg)
}

// argNames returns a cobra.PositionalArgs that wants exactly the named
// arguments, failing with a usage error that names them.
func argNames(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == len(names) {
			for i, v := range args {
				if v == "" {
					return usagef("%s: %s is empty", cmd.CommandPath(), names[i])
				}
			}
			return nil
		}
		if len(names) == 0 {
			return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
		}
		want := strings.Join(names, " ")
		if len(args) < len(names) {
			return usagef("%s wants %s: missing %s", cmd.CommandPath(), want, strings.Join(names[len(args):], " "))
		}
		return usagef("%s wants %s: unexpected argument %q", cmd.CommandPath(), want, args[len(names)])
	}
}

// requireFlags fails with a usage error naming the first flag of names that
// was not given.
func requireFlags(cmd *cobra.Command, names ...string) error {
	for _, n := range names {
		if !cmd.Flags().Changed(n) {
			return usagef("--%s is required", n)
		}
	}
	return nil
}

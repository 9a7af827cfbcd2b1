// Command tokenserver runs one tokenserver node: the gRPC token and admin
// services and the HTTP health endpoints. With no flags it is a single node
// on 127.0.0.1:7070 (gRPC) and 127.0.0.1:7072 (HTTP).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/server"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "tokenserver:", err)
		os.Exit(2)
	}
}

// options are the command's flags.
type options struct {
	cfg       server.Config
	dataDir   string
	logFormat string
	logLevel  string
}

// envName is the environment variable that sets a flag: TOKENSERVER_ and the
// flag's name in upper case with - as _.
func envName(flagName string) string {
	return "TOKENSERVER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{cfg: server.DefaultConfig()}
	host, _ := os.Hostname()
	if host != "" {
		o.cfg.NodeID = host
	}
	fs := flag.NewFlagSet("tokenserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cfg.NodeID, "node-id", o.cfg.NodeID, "this node's id in the cluster (default: the host name)")
	fs.StringVar(&o.cfg.GRPCAddr, "grpc-addr", o.cfg.GRPCAddr, "listen address of the gRPC TokenService and AdminService")
	fs.StringVar(&o.cfg.HTTPAddr, "http-addr", o.cfg.HTTPAddr, "listen address of HTTP /healthz and /readyz (empty: off)")
	fs.StringVar(&o.cfg.AdvertiseGRPC, "advertise-grpc", "", "gRPC address that clients and other nodes dial (default: --grpc-addr)")
	fs.StringVar(&o.dataDir, "data-dir", "./data", "directory for the node's durable state; in this single-node build rules are kept in memory and a restart loses them")
	fs.Int64Var(&o.cfg.MaxBuckets, "max-buckets", o.cfg.MaxBuckets, "most buckets (rule, key pairs) held at once; past it a new key gets RESOURCE_EXHAUSTED (0: no cap)")
	fs.IntVar(&o.cfg.Shards, "shards", 0, "lock stripes for buckets, a power of two (0: 64)")
	fs.IntVar(&o.cfg.MaxRecvMsgSize, "max-msg-size", o.cfg.MaxRecvMsgSize, "largest gRPC request accepted, in bytes")
	fs.DurationVar(&o.cfg.DefaultDeadline, "default-deadline", o.cfg.DefaultDeadline, "deadline given to calls that carry none")
	fs.DurationVar(&o.cfg.SweepInterval, "sweep-interval", o.cfg.SweepInterval, "how often idle buckets are evicted")
	fs.DurationVar(&o.cfg.ShutdownGrace, "shutdown-grace", o.cfg.ShutdownGrace, "on SIGTERM, how long calls in flight may finish")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tokenserver [flags]\n\nRuns one tokenserver node. Every flag can also be set by an environment\nvariable: TOKENSERVER_ and the flag name in upper case, - as _\n(e.g. TOKENSERVER_GRPC_ADDR). A flag given on the command line wins.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(envName(f.Name)); ok && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only; see --help)", fs.Arg(0))
	}
	return o, nil
}

func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func run(args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(o.logFormat, o.logLevel, stderr)
	if err != nil {
		return err
	}
	o.cfg.Logger = log
	node, err := server.New(o.cfg, rule.NewMemStore())
	if err != nil {
		return err
	}
	if err := node.Listen(); err != nil {
		return err
	}
	log.Info("rules are kept in memory in this build: a restart starts with no rules", "data_dir", o.dataDir, "pid", strconv.Itoa(os.Getpid()))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	err = node.Serve(ctx)
	log.Info("tokenserver stopped", "uptime", time.Since(start).Round(time.Millisecond).String())
	return err
}

// Command tokenserver runs one tokenserver node: the gRPC token and admin
// services and the HTTP health endpoints. With no flags it is a single node
// on 127.0.0.1:7070 (gRPC) and 127.0.0.1:7072 (HTTP).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/buildinfo"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/envoyrls/xds"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/tlsutil"

	_ "time/tzdata" // calendar windows name IANA zones; the host may lack a zone database
)

func main() {
	args := os.Args[1:]
	var err error
	if len(args) > 0 && args[0] == "recover" {
		err = runRecover(args[1:], os.Stdout, os.Stderr)
	} else {
		err = run(args, os.Stdout, os.Stderr)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "tokenserver:", err)
		os.Exit(1)
	}
}

// printFlags prints a flag set's flags as --name, with their defaults.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintln(w, line)
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
			usage += fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintf(w, "    \t%s\n", strings.ReplaceAll(usage, "\n", "\n    \t"))
	})
}

// uint32Flag is a flag.Value of a uint32.
type uint32Flag struct{ p *uint32 }

func (f uint32Flag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*f.p), 10)
}

func (f uint32Flag) Set(s string) error {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("want a whole number below 2^32: %w", err)
	}
	*f.p = uint32(v)
	return nil
}

// options are the command's flags.
type options struct {
	gcPercent int
	cfg       server.Config
	raft      raftfsm.Config
	join      string
	peers     string
	logFormat string
	logLevel  string
	version   bool
	sec       securityFlags
	envoy     envoyFlags
	tracing   tracingFlags
}

// envoyFlags are the --envoy-* flags that need parsing.
type envoyFlags struct {
	headers, headerNames string
}

// securityFlags are the TLS and authentication flags.
type securityFlags struct {
	tlsCert, tlsKey, tlsClientCA, tlsClientAuth string
	peerCert, peerKey, peerCA                   string
	denySerials, peerIDPattern                  string
	httpTLS                                     bool
	authTokens                                  string
	insecure                                    bool
}

// envName is the environment variable that sets a flag: TOKENSERVER_ and the
// flag's name in upper case with - as _.
func envName(flagName string) string {
	return "TOKENSERVER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func parseFlags(args []string, stdout, stderr io.Writer) (*options, error) {
	o := &options{cfg: server.DefaultConfig(), raft: raftfsm.DefaultConfig()}
	o.raft.NodeID, _ = os.Hostname()
	fs := flag.NewFlagSet("tokenserver", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run and main print the error once
	fs.StringVar(&o.raft.NodeID, "node-id", o.raft.NodeID, "this node's id in the cluster (default: the host name)")
	fs.StringVar(&o.cfg.GRPCAddr, "grpc-addr", o.cfg.GRPCAddr, "listen address of the gRPC TokenService and AdminService")
	fs.StringVar(&o.cfg.HTTPAddr, "http-addr", o.cfg.HTTPAddr, "listen address of HTTP /healthz and /readyz (empty: off)")
	fs.StringVar(&o.cfg.AdvertiseGRPC, "advertise-grpc", "", "gRPC address that clients and other nodes dial (default: --grpc-addr)")
	fs.StringVar(&o.raft.DataDir, "data-dir", "./data", "directory of the Raft log, stable store and snapshots (rules survive restarts there)")
	fs.StringVar(&o.raft.RaftBind, "raft-addr", o.raft.RaftBind, "listen address of Raft")
	fs.StringVar(&o.raft.AdvertiseRaft, "advertise-raft", "", "Raft address that other nodes dial, a DNS name is fine (default: --raft-addr)")
	fs.StringVar(&o.join, "join", "", "comma-separated gRPC addresses of cluster members to ask to add this node; a node with Raft state ignores it")
	fs.IntVar(&o.raft.BootstrapExpect, "bootstrap-expect", 0, "bootstrap a new cluster of this many nodes once all --peers answer and none has state (0: off)")
	fs.StringVar(&o.peers, "peers", "", "with --bootstrap-expect: the members as id=host:raftport,... (this node included)")
	fs.IntVar(&o.raft.MaxVoters, "max-voters", o.raft.MaxVoters, "most voting members; further nodes stay non-voters and still own keys")
	fs.DurationVar(&o.raft.StabilizationTime, "stabilization-time", o.raft.StabilizationTime, "a joining node stays a non-voter until it has been healthy (caught up) this long; a member id rejoining from another address replaces the old one only after that one was unreachable this long")
	fs.DurationVar(&o.raft.DeadMemberAfter, "dead-member-after", o.raft.DeadMemberAfter, "remove a non-voter unreachable this long from the cluster (0: never)")
	fs.BoolVar(&o.raft.CleanupDeadVoters, "cleanup-dead-voters", false, "also remove voters unreachable for --dead-member-after, when the voters left keep a healthy quorum")
	fs.DurationVar(&o.raft.HeartbeatTimeout, "raft-heartbeat-timeout", o.raft.HeartbeatTimeout, "Raft heartbeat timeout")
	fs.DurationVar(&o.raft.ElectionTimeout, "raft-election-timeout", o.raft.ElectionTimeout, "Raft election timeout")
	fs.DurationVar(&o.raft.LeaderLeaseTimeout, "raft-leader-lease-timeout", o.raft.LeaderLeaseTimeout, "Raft leader lease timeout (at most the heartbeat timeout)")
	fs.Uint64Var(&o.raft.SnapshotThreshold, "raft-snapshot-threshold", o.raft.SnapshotThreshold, "Raft log entries between snapshots")
	fs.DurationVar(&o.raft.DownAfter, "down-after", o.raft.DownAfter, "drop a member from the routing view after this long without Raft contact or gRPC health")
	fs.DurationVar(&o.raft.UpAfter, "up-after", o.raft.UpAfter, "take a dropped member back into the routing view after this long healthy")
	fs.Int64Var(&o.cfg.MaxBuckets, "max-buckets", o.cfg.MaxBuckets, "most buckets (rule, key pairs) held at once; past it a new key gets RESOURCE_EXHAUSTED (0: no cap; --max-bucket-memory bounds memory)")
	fs.Var(server.BytesFlag{P: &o.cfg.MaxBucketMemory}, "max-bucket-memory", "bucket memory budget in bytes, with an optional KiB, MiB or GiB suffix (keys, index entries and algorithm state); past it a new key gets RESOURCE_EXHAUSTED (default: half of GOMEMLIMIT when set, else 1GiB)")
	fs.Var(server.BytesFlag{P: &o.cfg.MaxRuleTableBytes}, "max-rule-table-bytes", "most bytes of rules in the cluster, all rules together (e.g. 64MiB; 0: 64 MiB); a rule write past it gets RESOURCE_EXHAUSTED (the leader's value applies)")
	fs.IntVar(&o.cfg.MaxRules, "max-rules", o.cfg.MaxRules, "most rules in the cluster; a new rule past it gets RESOURCE_EXHAUSTED (the value of the node that leads when the rule is written applies)")
	fs.IntVar(&o.cfg.Shards, "shards", 0, "bucket index shards, each locked only to add or evict buckets (0: 64)")
	fs.IntVar(&o.cfg.MaxRecvMsgSize, "max-msg-size", o.cfg.MaxRecvMsgSize, "largest gRPC request accepted, in bytes")
	fs.DurationVar(&o.cfg.DefaultDeadline, "default-deadline", o.cfg.DefaultDeadline, "deadline given to calls that carry none")
	fs.DurationVar(&o.cfg.SweepInterval, "sweep-interval", o.cfg.SweepInterval, "how often idle buckets are evicted")
	fs.DurationVar(&o.cfg.ShutdownGrace, "shutdown-grace", o.cfg.ShutdownGrace, "on SIGTERM, the most time to leave the routing view, linger and let calls in flight finish")
	fs.IntVar(&o.cfg.MaxViewStreams, "max-view-streams", server.DefaultMaxViewStreams, "most WatchClusterView streams served at once; past it a new stream gets RESOURCE_EXHAUSTED (SDK clients watch another member)")
	fs.Var(uint32Flag{&o.cfg.MaxConcurrentStreams}, "max-concurrent-streams", fmt.Sprintf("most calls one client connection has open at once (HTTP/2 MAX_CONCURRENT_STREAMS; bounds a rapid-reset flood) (default %d)", server.DefaultMaxConcurrentStreams))
	fs.Var(uint32Flag{&o.cfg.MaxHeaderListSize}, "max-header-size", fmt.Sprintf("largest header block of a gRPC request, in bytes (default %d)", server.DefaultMaxHeaderListSize))
	fs.DurationVar(&o.cfg.ConnectionTimeout, "connection-timeout", server.DefaultConnectionTimeout, "time a new connection has for its TLS handshake and HTTP/2 preface")
	fs.IntVar(&o.cfg.MaxConns, "max-conns", server.DefaultMaxConns, "most connections the gRPC port holds at once; past it a new one is closed")
	fs.IntVar(&o.cfg.MaxConnsPerIP, "max-conns-per-ip", server.DefaultMaxConnsPerIP, "most gRPC connections from one remote IP address")
	fs.IntVar(&o.cfg.MaxHTTPConns, "max-http-conns", server.DefaultMaxHTTPConns, "most connections the HTTP port holds at once")
	fs.IntVar(&o.cfg.MaxHTTPConnsPerIP, "max-http-conns-per-ip", server.DefaultMaxHTTPConnsPerIP, "most HTTP connections from one remote IP address")
	fs.IntVar(&o.cfg.MaxHealthWatches, "max-health-watches", server.DefaultMaxHealthWatches, "most gRPC health Watch streams at once (Check, what probes use, is not capped)")
	fs.IntVar(&o.cfg.MaxViewStreamsPerPrincipal, "max-view-streams-per-principal", server.DefaultMaxViewStreamsPerPrincipal, "most WatchClusterView streams of one caller (its principal, or its IP address without authentication)")
	fs.DurationVar(&o.cfg.ForwardTimeout, "forward-timeout", server.DefaultForwardTimeout, "most time the first attempt of a call forwarded to a key's owner gets (and at most half the caller's time left) before the key's next owner decides")
	fs.StringVar(&o.cfg.MetricsAuth, "metrics-auth", "open", "who may read /metrics (rule names and traffic): open, or token (a bearer token of --auth-tokens with the viewer role)")
	fs.DurationVar(&o.cfg.ReplicationInterval, "replication-interval", o.cfg.ReplicationInterval, "longest a changed bucket of a durable rule waits before it is sent to its key's next owner (what a crash of its owner can admit again)")
	fs.DurationVar(&o.cfg.CheckpointInterval, "checkpoint-interval", o.cfg.CheckpointInterval, "how often durable buckets are checkpointed to --data-dir when any changed (one fsync each)")
	fs.DurationVar(&o.cfg.DrainLinger, "drain-linger", o.cfg.DrainLinger, "on SIGTERM, how long the node keeps answering after it left the routing view, while clients re-route")
	fs.IntVar(&o.gcPercent, "gc-percent", 400, "Go GC target percentage (GOGC), unless the GOGC variable is set; a high value trades memory for throughput (about 15% more AcquireToken calls/s than 100); cap memory with GOMEMLIMIT")
	fs.StringVar(&o.tracing.endpoint, "otlp-endpoint", "", "host:port of an OpenTelemetry collector's OTLP gRPC receiver: send spans of acquires and rule writes there (empty: tracing off)")
	fs.BoolVar(&o.tracing.insecure, "otlp-insecure", false, "send spans to --otlp-endpoint over plain gRPC instead of TLS")
	fs.Float64Var(&o.tracing.sample, "otlp-sample", 1, "fraction of traces started here to record (a caller's sampled trace is always followed)")
	fs.BoolVar(&o.cfg.Pprof, "pprof", false, "serve Go profiles under /debug/pprof/ on --pprof-addr")
	fs.StringVar(&o.cfg.PprofAddr, "pprof-addr", o.cfg.PprofAddr, "listen address of /debug/pprof/ with --pprof (plain HTTP: a loopback address unless --insecure)")
	fs.StringVar(&o.cfg.Envoy.ConfigDir, "envoy-config-dir", "", "envoyproxy/ratelimit's config directory (every *.yaml and *.yml), watched; the leader writes its domains through Raft")
	fs.DurationVar(&o.cfg.Envoy.PollInterval, "envoy-config-poll", 0, "how often --envoy-config-dir is read (0: 5s)")
	o.cfg.Envoy.XDS = xds.DefaultConfig()
	fs.StringVar(&o.cfg.Envoy.XDS.Server, "envoy-xds-server", "", "xDS management server host:port serving RateLimitConfig (Envoy Gateway's); the leader runs the client")
	fs.StringVar(&o.cfg.Envoy.XDS.NodeID, "envoy-xds-node-id", o.cfg.Envoy.XDS.NodeID, "node id sent to the xDS server")
	fs.StringVar(&o.cfg.Envoy.XDS.NodeMetadata, "envoy-xds-node-metadata", "", "xDS node metadata as KEY=VALUE,...")
	fs.StringVar(&o.cfg.Envoy.XDS.TLSCA, "envoy-xds-tls-ca", "", "PEM CA bundle that verifies the xDS server; turns TLS on")
	fs.StringVar(&o.cfg.Envoy.XDS.TLSCert, "envoy-xds-tls-cert", "", "PEM client certificate for mTLS to the xDS server")
	fs.StringVar(&o.cfg.Envoy.XDS.TLSKey, "envoy-xds-tls-key", "", "PEM private key of --envoy-xds-tls-cert")
	fs.StringVar(&o.cfg.Envoy.XDS.TLSServerName, "envoy-xds-tls-server-name", "", "name the xDS server's certificate must carry; turns TLS on")
	fs.StringVar(&o.envoy.headers, "envoy-rate-limit-headers", "off", "rate limit headers in RLS answers: off, draft, x-ratelimit or reference")
	fs.StringVar(&o.envoy.headerNames, "envoy-rate-limit-header-names", "", "LIMIT,REMAINING,RESET: header names of the x-ratelimit and reference modes")
	fs.Float64Var(&o.cfg.Envoy.NearLimitRatio, "envoy-near-limit-ratio", envoyrls.DefaultNearLimitRatio, "share of a limit above which hits count as near_limit in metrics")
	fs.BoolVar(&o.cfg.Envoy.Shadow, "envoy-shadow-mode", false, "answer every RLS call OK while still counting (the reference's SHADOW_MODE)")
	fs.StringVar(&o.sec.tlsCert, "tls-cert", "", "PEM certificate (with its chain) to serve TLS on the gRPC port, and on the HTTP port unless --http-tls=false; re-read when it changes")
	fs.StringVar(&o.sec.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&o.sec.tlsClientCA, "tls-client-ca", "", "PEM CA bundle that client certificates must chain to; turns certificate authentication on (and is the peer CA unless --peer-tls-ca)")
	fs.StringVar(&o.sec.tlsClientAuth, "tls-client-auth", "", "client certificates on the gRPC port: none, request (verified if offered) or require (default: request with --tls-client-ca, else none)")
	fs.BoolVar(&o.sec.httpTLS, "http-tls", true, "serve the HTTP port over TLS with --tls-cert when it is set")
	fs.StringVar(&o.sec.peerCert, "peer-tls-cert", "", "PEM certificate this node presents to its peers, Raft and gRPC (default: --tls-cert)")
	fs.StringVar(&o.sec.peerKey, "peer-tls-key", "", "PEM private key of --peer-tls-cert (default: --tls-key)")
	fs.StringVar(&o.sec.peerCA, "peer-tls-ca", "", "PEM CA bundle that peers' certificates must chain to (default: --tls-client-ca)")
	fs.StringVar(&o.sec.denySerials, "tls-deny-serials", "", "file of certificate serial numbers to refuse, client and peer certificates alike: one a line in hex (colons and 0x allowed), # comments; re-read when it changes, and streams of a newly denied certificate end")
	fs.StringVar(&o.sec.peerIDPattern, "peer-id-pattern", "", "also take a certificate as node ID's peer certificate when a URI SAN matches this pattern, {id} standing for the node id (a SPIFFE ID such as spiffe://cluster.local/ns/ts/sa/tokenserver/{id}); default: tokenserver://node/ID only")
	fs.StringVar(&o.sec.authTokens, "auth-tokens", "", "token file: lines of `sha256:HEX PRINCIPAL ROLE[,ROLE...]` (see tokenctl token create); callers then need a token or a client certificate; re-read when it changes")
	fs.BoolVar(&o.sec.insecure, "insecure", false, "listen on addresses other than loopback with neither TLS nor authentication anyway (anyone who reaches the node can rewrite its rules)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.Usage = func() {} // errors go to stderr alone; --help prints usage to stdout below
	usage := func() {
		fmt.Fprintf(stdout, "Usage: tokenserver [flags]\n       tokenserver recover --data-dir DIR --peers id=host:raftport,...\n\nRuns one tokenserver node. Every flag can also be set by an environment\nvariable: TOKENSERVER_ and the flag name in upper case, - as _\n(e.g. TOKENSERVER_GRPC_ADDR). A flag given on the command line wins.\n\nFlags:\n")
		printFlags(stdout, fs)
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
		if errors.Is(err, flag.ErrHelp) {
			usage()
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only; see --help)", fs.Arg(0))
	}
	o.cfg.CheckpointDir = o.raft.DataDir // durable buckets are checkpointed beside Raft's state
	var err error
	if o.raft.Peers, err = parsePeers(o.peers); err != nil {
		return nil, err
	}
	if o.raft.BootstrapExpect > 0 && o.join != "" {
		return nil, errors.New("--bootstrap-expect and --join exclude each other")
	}
	if o.raft.BootstrapExpect > 0 && len(o.raft.Peers) != o.raft.BootstrapExpect {
		return nil, fmt.Errorf("--bootstrap-expect is %d but --peers lists %d members", o.raft.BootstrapExpect, len(o.raft.Peers))
	}
	if o.raft.NodeID == "" {
		return nil, errors.New("--node-id is empty and the host name is unknown")
	}
	if o.cfg.Envoy.Headers, err = envoyrls.ParseHeaderMode(o.envoy.headers); err != nil {
		return nil, fmt.Errorf("--envoy-rate-limit-headers: %w", err)
	}
	if o.envoy.headerNames != "" {
		parts := strings.Split(o.envoy.headerNames, ",")
		if len(parts) != 3 {
			return nil, fmt.Errorf("--envoy-rate-limit-header-names: want LIMIT,REMAINING,RESET, got %q", o.envoy.headerNames)
		}
		o.cfg.Envoy.HeaderNames = envoyrls.HeaderNames{Limit: parts[0], Remaining: parts[1], Reset: parts[2]}
	}
	if r := o.cfg.Envoy.NearLimitRatio; r <= 0 || r > 1 {
		return nil, fmt.Errorf("--envoy-near-limit-ratio must be in (0, 1], got %v", r)
	}
	if o.cfg.Envoy.XDS.Enabled() {
		if err := o.cfg.Envoy.XDS.Validate(); err != nil {
			return nil, fmt.Errorf("--envoy-xds-*: %w", err)
		}
	} else {
		o.cfg.Envoy.XDS = xds.Config{}
	}
	return o, nil
}

// security builds the node's TLS and authentication from the flags and
// enforces the protected mode; the function it returns stops their file
// polling.
func (o *options) security(log *slog.Logger) (func(), error) {
	f := o.sec
	if f.tlsCert == "" && (f.tlsClientCA != "" || f.peerCert != "" || f.peerCA != "" || f.denySerials != "" || f.peerIDPattern != "") {
		return nil, errors.New("--tls-client-ca, --tls-deny-serials, --peer-id-pattern and the --peer-tls flags need --tls-cert and --tls-key: the gRPC port, which peers call too, must serve TLS")
	}
	if err := tlsutil.ValidPeerIDPattern(f.peerIDPattern); err != nil {
		return nil, fmt.Errorf("--peer-id-pattern: %w", err)
	}
	// A node without TLS has no reloader (it would log that certificates
	// were loaded).
	rl := (*tlsutil.Reloader)(nil)
	if f.tlsCert != "" {
		var err error
		if rl, err = tlsutil.New(tlsutil.Files{CertFile: f.tlsCert, KeyFile: f.tlsKey, ClientCAFile: f.tlsClientCA,
			PeerCertFile: f.peerCert, PeerKeyFile: f.peerKey, PeerCAFile: f.peerCA, DenySerialsFile: f.denySerials},
			tlsutil.Options{Logger: log, PeerIDPattern: f.peerIDPattern}); err != nil {
			return nil, err
		}
	}
	closeRL := func() {
		if rl != nil {
			rl.Close()
		}
	}
	mode := f.tlsClientAuth
	if mode == "" {
		mode = "none"
		if f.tlsClientCA != "" {
			mode = "request"
		}
	}
	ca, err := tlsutil.ParseClientAuth(mode)
	if err != nil {
		closeRL()
		return nil, fmt.Errorf("--tls-client-auth: %w", err)
	}
	if ca != tlsutil.ClientAuthNone && f.tlsClientCA == "" {
		closeRL()
		return nil, fmt.Errorf("--tls-client-auth=%s needs --tls-client-ca", mode)
	}
	// A peer certificate counts only for a member of the Raft
	// configuration (the node keeps members current), and no certificate
	// on the deny list counts.
	members := &server.Membership{}
	ao := auth.Options{TokenFile: f.authTokens, ClientCerts: f.tlsClientCA != "", Logger: log, Members: members.Contains}
	if rl != nil {
		ao.CertDenied = rl.SerialDenied
	}
	az, err := auth.New(ao)
	if err != nil {
		closeRL()
		return nil, err
	}
	closeAll := func() { az.Close(); closeRL() }
	if err := auth.CheckExposure(f.tlsCert != "", az.Enabled(), f.insecure, o.cfg.GRPCAddr, o.raft.RaftBind, o.cfg.HTTPAddr); err != nil {
		closeAll()
		return nil, err
	}
	if err := checkCallerAuth(f.tlsCert != "", az.Enabled(), f.insecure, o.cfg.GRPCAddr); err != nil {
		closeAll()
		return nil, err
	}
	if f.tlsCert != "" && !az.Enabled() {
		log.Warn("TLS without caller authentication: anyone who reaches the gRPC port can call every method, writes included; add --auth-tokens or --tls-client-ca", "grpc", o.cfg.GRPCAddr)
	}
	if o.cfg.Pprof && !auth.IsLoopback(o.cfg.PprofAddr) && !f.insecure {
		closeAll()
		return nil, fmt.Errorf("--pprof-addr %s is not a loopback address: profiles and the command line are served in the clear to anyone; use 127.0.0.1 or pass --insecure", o.cfg.PprofAddr)
	}
	o.cfg.Security = server.Security{ClientAuth: ca, HTTPTLS: f.httpTLS, Auth: az, Members: members, Insecure: f.insecure}
	if f.tlsCert != "" {
		o.cfg.Security.TLS = rl
	}
	return closeAll, nil
}

// checkCallerAuth is the protected mode's second half (auth.CheckExposure
// is the first): TLS encrypts, but says nothing of who calls, so a gRPC
// port that other hosts reach needs caller authentication (--auth-tokens
// or --tls-client-ca) unless --insecure.
func checkCallerAuth(tlsOn, authOn, insecure bool, grpcAddr string) error {
	if !tlsOn || authOn || insecure || auth.IsLoopback(grpcAddr) {
		return nil
	}
	return fmt.Errorf("refusing to serve %s with TLS but no caller authentication: TLS encrypts the calls but anyone who reaches the port could rewrite the rules and save snapshots. "+
		"Add --auth-tokens and/or --tls-client-ca (callers' identities), listen on 127.0.0.1, or pass --insecure", grpcAddr)
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

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stdout, stderr)
	if err != nil {
		return err
	}
	if o.version {
		fmt.Fprintln(stdout, "tokenserver", buildinfo.Version())
		return nil
	}
	log, err := newLogger(o.logFormat, o.logLevel, stderr)
	if err != nil {
		return err
	}
	o.cfg.Logger = log
	o.raft.Logger = log
	closeSec, err := o.security(log)
	if err != nil {
		return err
	}
	defer closeSec()
	stopTracing, err := o.setupTracing(log)
	if err != nil {
		return err
	}
	defer stopTracing()
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(o.gcPercent)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		budget := cmp.Or(o.cfg.MaxBucketMemory, server.DefaultBucketMemory())
		o.cfg.MaxBucketMemory = budget // fixed before the limit changes DefaultBucketMemory
		limit := server.MemoryLimitFor(budget)
		debug.SetMemoryLimit(limit)
		log.Info("memory limit set from --max-bucket-memory (GOMEMLIMIT is not set)", "max_bucket_memory", budget, "memory_limit", limit)
	}
	var join []string
	for _, a := range strings.Split(o.join, ",") {
		if a = strings.TrimSpace(a); a != "" {
			join = append(join, a)
		}
	}
	node, lis, err := server.Start(server.Options{Server: o.cfg, Raft: o.raft, Join: join})
	if err != nil {
		return err
	}
	log.Info("tokenserver starting", "node", o.raft.NodeID, "data_dir", o.raft.DataDir, "pid", os.Getpid())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	err = node.Serve(ctx, lis)
	log.Info("tokenserver stopped", "uptime", time.Since(start).Round(time.Millisecond).String())
	return err
}

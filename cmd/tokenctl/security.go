package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokenserver/tokenserver/client"
	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// Environment twins of the security flags.
const (
	tlsCAEnv         = "TOKENSERVER_TLS_CA"
	tlsCertEnv       = "TOKENSERVER_TLS_CERT"
	tlsKeyEnv        = "TOKENSERVER_TLS_KEY"
	tlsServerNameEnv = "TOKENSERVER_TLS_SERVER_NAME"
	tokenEnv         = "TOKENSERVER_TOKEN"
)

// security holds the global TLS and token flags.
type security struct {
	tlsCA, tlsCert, tlsKey, tlsServerName, token string
}

// addFlags registers the security flags on pf, defaulting to their
// environment twins.
func (s *security) addFlags(pf interface {
	StringVar(p *string, name, value, usage string)
}) {
	pf.StringVar(&s.tlsCA, "tls-ca", os.Getenv(tlsCAEnv), "CA bundle to verify the server with; turns TLS on (env "+tlsCAEnv+")")
	pf.StringVar(&s.tlsCert, "tls-cert", os.Getenv(tlsCertEnv), "client certificate for mTLS; turns TLS on (env "+tlsCertEnv+")")
	pf.StringVar(&s.tlsKey, "tls-key", os.Getenv(tlsKeyEnv), "key of --tls-cert (env "+tlsKeyEnv+")")
	pf.StringVar(&s.tlsServerName, "tls-server-name", os.Getenv(tlsServerNameEnv), "name to verify the server's certificate against (default: the host of --server); turns TLS on (env "+tlsServerNameEnv+")")
	pf.StringVar(&s.token, "token", os.Getenv(tokenEnv), "bearer token sent with every call (env "+tokenEnv+"; prefer the environment: flags show in ps)")
}

// tls reports whether a TLS flag is set.
func (s *security) tls() bool {
	return s.tlsCA != "" || s.tlsCert != "" || s.tlsKey != "" || s.tlsServerName != ""
}

// tlsConfig builds the client TLS config of the flags.
func (s *security) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.tlsServerName}
	if s.tlsCA != "" {
		pem, err := os.ReadFile(s.tlsCA)
		if err != nil {
			return nil, usagef("--tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--tls-ca %s holds no PEM certificate", s.tlsCA)
		}
		cfg.RootCAs = pool
	}
	if (s.tlsCert == "") != (s.tlsKey == "") {
		return nil, usagef("--tls-cert and --tls-key go together")
	}
	if s.tlsCert != "" {
		pair, err := tls.LoadX509KeyPair(s.tlsCert, s.tlsKey)
		if err != nil {
			return nil, usagef("--tls-cert/--tls-key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// dialOptions are the transport and per-call credentials of the flags;
// with a probe, TLS handshake failures are recorded in it.
func (s *security) dialOptions(probe *connProbe) ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if s.tls() {
		cfg, err := s.tlsConfig()
		if err != nil {
			return nil, err
		}
		creds := credentials.NewTLS(cfg)
		if probe != nil {
			creds = &recordingCreds{TransportCredentials: creds, probe: probe}
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if s.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(auth.BearerToken{Token: s.token}))
	}
	return opts, nil
}

// clientOptions are the SDK options of the flags (bench --mode lease).
func (s *security) clientOptions() ([]client.Option, error) {
	var opts []client.Option
	if s.tls() {
		cfg, err := s.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if s.token != "" {
		opts = append(opts, client.WithToken(s.token))
	}
	return opts, nil
}

// newCertsCmd is `tokenctl certs`: a CA and certificates for a first
// cluster.
func newCertsCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make a CA and node and client certificates for a first cluster (ECDSA P-256)",
		Long: `certs makes a CA, node certificates and client certificates (ECDSA P-256)
for a first cluster: create-ca once, then create-node for each node and
create-client for each client. Files go to --out-dir (keys with mode 0600);
existing files are not overwritten without --force. With --kubernetes-secret
NAME the command also prints a kubernetes.io/tls Secret (tls.crt, tls.key,
ca.crt) to stdout.

A node certificate names its node id in a URI SAN tokenserver://node/NAME,
which is what makes it a peer certificate when one CA signs both nodes and
clients; it serves and dials (server and client auth). A client
certificate names tokenserver://client/NAME and carries its roles as OU
values.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	var o certOptions
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.outDir, "out-dir", ".", "directory of the CA and the certificates")
	pf.StringVar(&o.caCert, "ca-cert", "", "CA certificate (default OUT-DIR/ca.crt)")
	pf.StringVar(&o.caKey, "ca-key", "", "CA key (default OUT-DIR/ca.key)")
	pf.DurationVar(&o.lifetime, "lifetime", 0, "validity (default: 10 years for a CA, 1 year for a certificate)")
	pf.StringVar(&o.secret, "kubernetes-secret", "", "also print a kubernetes.io/tls Secret of this name to stdout")
	pf.StringVar(&o.namespace, "namespace", "", "namespace of the Secret")
	pf.BoolVar(&o.force, "force", false, "overwrite existing files")

	createCA := &cobra.Command{
		Use:   "create-ca",
		Short: "Make a CA: OUT-DIR/ca.crt and ca.key",
		Args:  argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			name, _ := cmd.Flags().GetString("name")
			ca, err := tlsutil.NewCA(name, o.lifetime)
			if err != nil {
				return err
			}
			return o.write(a, "ca", ca.CertPEM, ca.KeyPEM, ca.CertPEM)
		},
	}
	createCA.Flags().String("name", "tokenserver CA", "the CA's common name")

	var dns, nodeIDs []string
	var ips []net.IP
	createNode := &cobra.Command{
		Use:   "create-node NAME",
		Short: "Make a node certificate: OUT-DIR/NAME.crt and NAME.key (NAME is the node id)",
		Args:  argNames("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if len(dns) == 0 && len(ips) == 0 {
				dns = []string{name}
			}
			if len(nodeIDs) == 0 {
				nodeIDs = []string{name}
			}
			var uris []*url.URL
			for _, id := range nodeIDs {
				uris = append(uris, tlsutil.NodeURI(id))
			}
			return o.issue(a, name, tlsutil.CertRequest{CommonName: name, DNSNames: dns, IPs: ips,
				URIs: uris, Server: true, Client: true, Lifetime: o.lifetime})
		},
	}
	createNode.Flags().StringSliceVar(&dns, "dns", nil, "DNS names of the node (repeatable; default NAME)")
	createNode.Flags().IPSliceVar(&ips, "ip", nil, "IP addresses of the node (repeatable)")
	createNode.Flags().StringSliceVar(&nodeIDs, "node-id", nil, "node ids the certificate names as tokenserver://node/ID (repeatable; default NAME; a Secret shared by a StatefulSet's pods names them all)")

	var roles string
	createClient := &cobra.Command{
		Use:   "create-client NAME",
		Short: "Make a client certificate: OUT-DIR/NAME.crt and NAME.key",
		Args:  argNames("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := auth.ParseRoles(roles)
			if err != nil {
				return usagef("--role: %v", err)
			}
			return o.issue(a, args[0], tlsutil.CertRequest{CommonName: args[0], URIs: []*url.URL{tlsutil.ClientURI(args[0])},
				OrganizationalUnits: strings.Split(r.String(), ","), Client: true, Lifetime: o.lifetime})
		},
	}
	createClient.Flags().StringVar(&roles, "role", "client", "roles, comma-separated: client, viewer, editor, admin")

	cmd.AddCommand(createCA, createNode, createClient)
	return cmd
}

type certOptions struct {
	outDir, caCert, caKey string
	lifetime              time.Duration
	secret, namespace     string
	force                 bool
}

// issue signs req with the CA and writes NAME.crt and NAME.key.
func (o *certOptions) issue(a *app, name string, req tlsutil.CertRequest) error {
	if strings.ContainsAny(name, `/\`) || name == "ca" {
		return usagef("NAME %q must not be ca or hold a path separator", name)
	}
	caCert, caKey := o.caCert, o.caKey
	if caCert == "" {
		caCert = filepath.Join(o.outDir, "ca.crt")
	}
	if caKey == "" {
		caKey = filepath.Join(o.outDir, "ca.key")
	}
	ca, err := tlsutil.LoadCA(caCert, caKey)
	if err != nil {
		return fmt.Errorf("%w (make one with tokenctl certs create-ca)", err)
	}
	kp, err := ca.Issue(req)
	if err != nil {
		return err
	}
	return o.write(a, name, kp.CertPEM, kp.KeyPEM, ca.CertPEM)
}

// write writes NAME.crt and NAME.key, reports them and prints the Secret
// when asked.
func (o *certOptions) write(a *app, name string, certPEM, keyPEM, caPEM []byte) error {
	certFile, keyFile := filepath.Join(o.outDir, name+".crt"), filepath.Join(o.outDir, name+".key")
	if !o.force {
		for _, f := range []string{certFile, keyFile} {
			if _, err := os.Stat(f); err == nil {
				return fmt.Errorf("%s exists; pass --force to overwrite", f)
			} else if !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return fmt.Errorf("--out-dir: %w", err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return fmt.Errorf("write certificate: %w", err)
	}
	if o.secret != "" {
		return writeSecret(a.stdout, o.secret, o.namespace, certPEM, keyPEM, caPEM)
	}
	if a.structured() {
		return a.write(map[string]string{"cert": certFile, "key": keyFile})
	}
	_, err := fmt.Fprintf(a.stdout, "wrote %s and %s\n", certFile, keyFile)
	return err
}

// writeSecret prints a kubernetes.io/tls Secret with tls.crt, tls.key and
// ca.crt (cert-manager's layout, which the TLS overlay mounts).
func writeSecret(w io.Writer, name, namespace string, certPEM, keyPEM, caPEM []byte) error {
	b64 := base64.StdEncoding.EncodeToString
	ns := ""
	if namespace != "" {
		ns = "\n  namespace: " + namespace
	}
	_, err := fmt.Fprintf(w, `apiVersion: v1
kind: Secret
metadata:
  name: %s%s
  labels:
    app.kubernetes.io/name: tokenserver
type: kubernetes.io/tls
data:
  tls.crt: %s
  tls.key: %s
  ca.crt: %s
`, name, ns, b64(certPEM), b64(keyPEM), b64(caPEM))
	return err
}

// newTokenCmd is `tokenctl token create`.
func newTokenCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Make bearer tokens for --auth-tokens",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	var appendTo string
	create := &cobra.Command{
		Use:   "create PRINCIPAL ROLES",
		Short: "Print a random token and its line for the server's --auth-tokens file",
		Long: `create prints a random bearer token (256 bits) and the line that admits it
in the server's --auth-tokens file, which holds only the token's SHA-256.
ROLES is comma-separated: client, viewer, editor, admin; it may end in
:PATTERN (client,editor:team-a/*) to limit the caller to the rules named
PATTERN, or under its prefix before a trailing *. Give the token to
the caller (tokenctl --token or TOKENSERVER_TOKEN, the SDK's WithToken) and
append the line to the file on every node: they re-read it on change.

--append FILE adds the line to FILE itself, keeping its other lines as
they are: the new file is written beside it and renamed over it, so a
server re-reading it sees the old file or the new one, never half of one.
A missing FILE is created (mode 0600); an existing one keeps its mode.
Two appends to one file at the same moment can lose one of the lines.`,
		Example: `  tokenctl token create ci editor
  tokenctl token create ci editor --append /etc/tokenserver/tokens
  tokenctl token create team-a 'client,editor:team-a/*' --append /etc/tokenserver/tokens`,
		Args: argNames("PRINCIPAL", "ROLES"),
		RunE: func(cmd *cobra.Command, args []string) error {
			roles, scope, err := auth.ParseRoleField(args[1])
			if err != nil {
				return usagef("ROLES: %v", err)
			}
			tok, line, err := auth.NewToken(args[0], roles)
			if err != nil {
				return usagef("%v", err)
			}
			roleField := roles.String()
			if scope != "" {
				roleField += ":" + scope
				line += ":" + scope
			}
			if appendTo != "" {
				if err := appendLineAtomic(appendTo, line); err != nil {
					return fmt.Errorf("token create --append: %w", err)
				}
			}
			if a.structured() {
				out := map[string]string{"principal": args[0], "roles": roleField, "token": tok, "line": line}
				if appendTo != "" {
					out["file"] = appendTo
				}
				return a.write(out)
			}
			if _, err := fmt.Fprintf(a.stdout, "token: %s\nline:  %s\n", tok, line); err != nil {
				return err
			}
			if appendTo != "" {
				_, err = fmt.Fprintf(a.stdout, "appended the line to %s\n", appendTo)
			}
			return err
		},
	}
	create.Flags().StringVar(&appendTo, "append", "", "also append the line to this token file (atomic rename; other lines kept)")
	cmd.AddCommand(create)
	return cmd
}

// appendLineAtomic adds line to the file path (created 0600 if missing),
// keeping its content byte for byte and its mode, by writing the whole new
// file beside it and renaming it over path.
func appendLineAtomic(path, line string) error {
	data, err := os.ReadFile(path)
	mode := os.FileMode(0o600)
	switch {
	case err == nil:
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		mode = fi.Mode().Perm()
	case errors.Is(err, os.ErrNotExist):
	default:
		return err
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	data = append(data, line...)
	data = append(data, '\n')
	return writeFileAtomicMode(path, data, mode)
}

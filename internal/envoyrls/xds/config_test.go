package xds

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	"google.golang.org/grpc/backoff"
)

func TestConfigValidate(t *testing.T) {
	on := func(f func(*Config)) Config {
		c := DefaultConfig()
		c.Server = "xds.example:18000"
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"off", DefaultConfig(), ""},
		{"on", on(func(*Config) {}), ""},
		{"metadata", on(func(c *Config) { c.NodeMetadata = "a=1,b=,c=x=y" }), ""},
		{"mTLS", on(func(c *Config) { c.TLSCA, c.TLSCert, c.TLSKey, c.TLSServerName = "ca", "c", "k", "n" }), ""},
		{"TLS off without server", func() Config { c := DefaultConfig(); c.TLSCA = "ca"; return c }(), "need --envoy-xds-server"},
		{"metadata without server", func() Config { c := DefaultConfig(); c.NodeMetadata = "a=b"; return c }(), "need --envoy-xds-server"},
		{"space in server", on(func(c *Config) { c.Server = "a b:1" }), "--envoy-xds-server"},
		{"empty node id", on(func(c *Config) { c.NodeID = "" }), "--envoy-xds-node-id"},
		{"metadata without =", on(func(c *Config) { c.NodeMetadata = "a=1,b" }), `--envoy-xds-node-metadata: "b"`},
		{"metadata empty key", on(func(c *Config) { c.NodeMetadata = "=1" }), "--envoy-xds-node-metadata"},
		{"metadata trailing comma", on(func(c *Config) { c.NodeMetadata = "a=1," }), "--envoy-xds-node-metadata"},
		{"cert without key", on(func(c *Config) { c.TLSCert = "c" }), "--envoy-xds-tls-cert and --envoy-xds-tls-key"},
		{"key without cert", on(func(c *Config) { c.TLSKey = "k" }), "--envoy-xds-tls-cert and --envoy-xds-tls-key"},
		{"zero backoff", on(func(c *Config) { c.Backoff = backoff.Config{} }), "Backoff.BaseDelay"},
		{"max below base", on(func(c *Config) { c.Backoff.MaxDelay = time.Millisecond }), "Backoff.MaxDelay"},
		{"multiplier", on(func(c *Config) { c.Backoff.Multiplier = 0.5 }), "Backoff.Multiplier"},
		{"jitter", on(func(c *Config) { c.Backoff.Jitter = 2 }), "Backoff.Jitter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := tlsutil.NewCA("ca", 0)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	with := func(f func(*Config)) Config {
		c := DefaultConfig()
		c.Server = "127.0.0.1:1"
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"off", DefaultConfig(), "--envoy-xds-server is empty"},
		{"invalid", with(func(c *Config) { c.NodeID = "" }), "--envoy-xds-node-id"},
		{"missing CA", with(func(c *Config) { c.TLSCA = filepath.Join(dir, "none.pem") }), "--envoy-xds-tls-ca"},
		{"CA not PEM", with(func(c *Config) { c.TLSCA = garbage }), "no PEM certificate"},
		{"bad key pair", with(func(c *Config) { c.TLSCA, c.TLSCert, c.TLSKey = caFile, garbage, garbage }), "--envoy-xds-tls-cert/--envoy-xds-tls-key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(tc.cfg, func(_ context.Context, _ *envoyrls.Config, _ string) error { return nil }, nil)
			if err == nil {
				c.conn.Close()
				t.Fatal("New accepted the configuration")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := New(with(func(*Config) {}), nil, nil); err == nil || !strings.Contains(err.Error(), "nil callback") {
		t.Errorf("New(nil callback) = %v", err)
	}
}

func TestDelay(t *testing.T) {
	c := &Client{cfg: Config{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.1, MaxDelay: time.Second}}}
	for n, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second} {
		for range 20 {
			if d := c.delay(n); d < want*9/10 || d > want*11/10 {
				t.Fatalf("delay(%d) = %v, want %v ±10%%", n, d, want)
			}
		}
	}
}

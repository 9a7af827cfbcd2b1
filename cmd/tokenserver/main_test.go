package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/testcluster"
)

// TestProtectedMode: a node asked to listen beyond loopback with neither
// TLS nor authentication nor --insecure refuses to start and says what to
// add; so do the other unsafe combinations. Nothing listens: each fails
// before opening a port.
func TestProtectedMode(t *testing.T) {
	pki := testcluster.NewPKI(t, "n0")
	cert, key := pki.NodeFiles("n0")
	dir := t.TempDir()
	base := []string{"--data-dir", filepath.Join(dir, "data"), "--node-id", "n0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--raft-addr", "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"gRPC on all interfaces", []string{"--grpc-addr", "0.0.0.0:7070"},
			[]string{"0.0.0.0:7070", "--tls-cert", "--auth-tokens", "--insecure"}},
		{"Raft on a host address", []string{"--raft-addr", "10.1.2.3:7071"},
			[]string{"10.1.2.3:7071", "--tls-cert", "--insecure"}},
		{"HTTP on all interfaces", []string{"--http-addr", ":7072"},
			[]string{":7072", "--insecure"}},
		{"pprof beyond loopback", []string{"--pprof", "--pprof-addr", "0.0.0.0:7073"},
			[]string{"--pprof-addr", "--insecure"}},
		{"a client CA without a certificate", []string{"--tls-client-ca", pki.CAFile},
			[]string{"--tls-cert"}},
		{"require without a client CA", []string{"--tls-cert", cert, "--tls-key", key, "--tls-client-auth", "require"},
			[]string{"--tls-client-ca"}},
		{"a cluster with TLS but no peer CA", []string{"--tls-cert", cert, "--tls-key", key, "--join", "127.0.0.1:1"},
			[]string{"peer CA", "--peer-tls-ca"}},
		{"a cluster with tokens but no TLS", []string{"--auth-tokens", pki.TokenFile, "--join", "127.0.0.1:1"},
			[]string{"--tls-cert"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(append(append([]string{}, base...), tc.args...), io.Discard, io.Discard)
			if err == nil {
				t.Fatal("started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestProtectedModeNeedsCallerAuth: TLS is no protection on its own: a
// node with a certificate (and a peer CA) but no caller authentication on
// an address beyond loopback refuses to start, naming what to add; with
// --auth-tokens, --tls-client-ca, --insecure or on loopback it may.
func TestProtectedModeNeedsCallerAuth(t *testing.T) {
	pki := testcluster.NewPKI(t, "n0")
	cert, key := pki.NodeFiles("n0")
	dir := t.TempDir()
	base := []string{"--data-dir", filepath.Join(dir, "data"), "--node-id", "n0", "--http-addr", "", "--raft-addr", "127.0.0.1:0",
		"--grpc-addr", "0.0.0.0:7070", "--tls-cert", cert, "--tls-key", key}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"TLS alone", nil},
		{"TLS and a peer CA", []string{"--peer-tls-ca", pki.CAFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(append(append([]string{}, base...), tc.args...), io.Discard, io.Discard)
			if err == nil {
				t.Fatal("started")
			}
			for _, w := range []string{"0.0.0.0:7070", "no caller authentication", "--auth-tokens", "--tls-client-ca", "--insecure"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	for _, tc := range []struct {
		tls, auth, insecure bool
		addr                string
		ok                  bool
	}{
		{true, false, false, "0.0.0.0:7070", false},
		{true, true, false, "0.0.0.0:7070", true},
		{true, false, true, "0.0.0.0:7070", true},
		{true, false, false, "127.0.0.1:7070", true},
		{false, false, false, "0.0.0.0:7070", true}, // auth.CheckExposure's case
	} {
		if err := checkCallerAuth(tc.tls, tc.auth, tc.insecure, tc.addr); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc, err)
		}
	}
}

// TestMemoryLimitFromBudget: without GOMEMLIMIT the soft memory limit
// leaves the budget a quarter more and 48 MiB, under the 1.25 × budget +
// 64 MiB that peak RSS must stay within.
func TestMemoryLimitFromBudget(t *testing.T) {
	for _, budget := range []int64{1 << 20, 64 << 20, 1 << 30} {
		got := server.MemoryLimitFor(budget)
		if got <= budget || got > budget+budget/4+64<<20 {
			t.Errorf("budget %d: limit %d", budget, got)
		}
	}
}

package auth

import (
	"fmt"
	"net"
	"strings"
)

// CheckExposure enforces the protected mode: with neither TLS nor
// authentication a node may listen only on loopback addresses, unless
// insecure (--insecure) says the operator wants it anyway. addrs are the
// listen addresses (gRPC, Raft, HTTP, pprof); empty ones are skipped. The
// error names the first exposed address and the flags that fix it.
func CheckExposure(tlsOn, authOn, insecure bool, addrs ...string) error {
	if tlsOn || authOn || insecure {
		return nil
	}
	var exposed []string
	for _, a := range addrs {
		if a != "" && !IsLoopback(a) {
			exposed = append(exposed, a)
		}
	}
	if len(exposed) == 0 {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s without TLS or authentication: anyone who reaches it could rewrite the rules and the cluster. "+
		"Add --tls-cert and --tls-key (with --tls-client-ca and/or --auth-tokens for callers' identities, and peer certificates for Raft), "+
		"listen on 127.0.0.1, or pass --insecure to serve in the clear anyway", strings.Join(exposed, ", "))
}

// IsLoopback reports whether a listen address (host:port) binds only
// loopback: a loopback IP or "localhost". An empty host, 0.0.0.0, :: and
// any other name are not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// Package xds is tokenserver's xDS state-of-the-world client for
// ratelimit.config.ratelimit.v3.RateLimitConfig resources, as
// envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW: it turns each set the
// management server sends (Envoy Gateway's, for one) into an envoyrls.Config
// and hands it to a callback, ACKing what the callback accepts and NACKing
// the rest.
//
// The flags that configure it, one per Config field:
//
//	--envoy-xds-server ADDR         the management server, host:port (Server; empty: no xDS)
//	--envoy-xds-node-id ID          the node id snapshots are keyed by (NodeID, default "default")
//	--envoy-xds-node-metadata K=V,… node metadata, string values (NodeMetadata)
//	--envoy-xds-tls-ca FILE         CA bundle that verifies the server; turns TLS on (TLSCA)
//	--envoy-xds-tls-cert FILE       client certificate for mTLS, with --envoy-xds-tls-key (TLSCert)
//	--envoy-xds-tls-key FILE        its private key (TLSKey)
//	--envoy-xds-tls-server-name N   the name the server certificate must carry; turns TLS on (TLSServerName)
//
// The stream loop is written on the generated AggregatedDiscoveryService
// stub rather than on go-control-plane's pkg/client/sotw/v3 ADSClient:
// that client hides the version of the set it received, which the callback
// stores, and on a reconnect it ACKs the last set received even when that set
// was NACKed, so a refused version would pass for the one in force.
package xds

// Package client is the Go SDK of tokenserver: it asks the cluster for
// permission before rate-limited work, and keeps deciding sensibly when the
// cluster is slow or gone.
//
// # Model
//
// Routing. New reads the cluster view (members, ownership epoch, and each
// rule's client-facing fields) from any seed address and then follows
// WatchClusterView. Every key is sent straight to the node that owns it,
// with the rendezvous hash the servers use (internal/cluster), over one gRPC
// connection per node. A call that lands on the wrong node during a view
// change is still answered: the server forwards it.
//
// Coalescing. Calls bound for the same node within a short window (default
// 200µs; WithCoalesceWindow) travel as one AcquireTokens RPC of at most 1000
// items; each caller gets its own answer and returns at its own deadline.
//
// Leases. A Limiter created WithLease, for a token bucket, fixed window or
// sliding window rule whose lease.max_batch is set, takes a batch of tokens
// for a hot key (one seen more than a few times per lease time) as a partial
// grant and serves calls from it locally, without an RPC and without
// allocating. The next batch is sized from the key's observed demand (rate ×
// lease time), within the limiter's and the rule's caps. Leased tokens
// expire at the earliest of the lease time, the rule period and the grant's
// reset_after; unused ones are given back with RefillToken shortly before
// that, and on Close. Every token served from a lease was granted by the
// server, so leases never admit more than the server granted: for a token
// bucket, admissions in any window T stay within burst + rate × (T + L),
// where L is the longest a lease lives (its expiry, above); while demand
// keeps leases short-lived, as under saturation, that is burst + rate × T.
//
// Fallback. When a key's owner does not answer within the call timeout
// (WithCallTimeout, default 50ms), or answers Unavailable or
// ResourceExhausted, the call is decided locally under the rule's fallback
// policy from the view: LOCAL throttles each (rule, key) with a
// golang.org/x/time/rate limiter at fallback.limit per rule period for this
// client instance; ALLOW admits; DENY refuses with ErrUnavailable. Until the
// view names the rule, the Limiter's WithFallback option decides; when
// neither does, the call is allowed (counted in
// tokenserver_client_fallback_default_allow_total). During fallback the
// over-admission is therefore bounded by the policy: at most fallback.limit
// per period (plus its burst) per client instance and key for LOCAL. A
// server denial is never turned into a local allow.
//
// A circuit breaker per node opens after 3 failures in a row: calls for the
// node then go to fallback at once instead of waiting for their deadline,
// while a prober retries the node with full-jitter exponential backoff (50ms
// to 5s) and closes the breaker when it answers. A caller is never blocked
// longer than its deadline because the server is down. A call is retried
// (at most twice, with jitter, within its deadline) only when it provably
// never reached a server: the connection could not be made.
//
// A Client and its Limiters are safe for simultaneous use by multiple
// goroutines. Create one Client per process and one Limiter per rule, and
// reuse them.
package client

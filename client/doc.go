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
// Reservations. Limiter.Reserve takes an estimate of a cost known only
// after the work (LLM tokens, bytes, money) and Reservation.Commit settles
// it at what was used: less gives the difference back, more charges the
// extra even past zero, as debt the key repays before it admits again. A
// reservation is always its own grant on the key's owner, even on a
// limiter that leases: a leased batch is one grant on the server, settled
// once (by its refill), so a reservation served from a lease could not be
// charged past the batch after the lease ended. Settling every
// reservation against the server's accounting keeps "the total charged
// equals the total committed" exact, and leases keep serving AllowN
// beside it. A commit is idempotent by grant id (retry it freely); one not
// made within the rule's reservation TTL leaves the estimate charged
// (ErrReservationNotFound). A reservation granted by the fallback policy
// settles locally: a LOCAL overrun is charged to the local limiter, and
// nothing is given back.
//
// All or nothing. Client.AllowAll grants several items (org, team and
// user budgets of one request) together or not at all, in one
// AcquireTokens with all_or_nothing. It never over-admits; while granted
// items of a denied whole are given back (one round trip), they briefly
// hold their permits: under-admission of at most the items' permits.
//
// Never looser than the rule. The SDK keeps the last fallback policy and
// lease settings it learned for each rule until a ready node's view changes
// or deletes that rule. A view from a node that is not ready (it may still
// be replaying its Raft log, and lack rules that exist) never removes or
// loosens anything: it changes no rule, and it moves routing only to a
// newer epoch. Views fetched by probes from other members add rules and
// newer versions, never delete. So a local decision is never more
// permissive than the last policy a ready node stated for the rule.
//
// No fallback while a server can decide. A node that was reached and
// decided nothing, because it is not ready or has no routing view yet
// (Unavailable with the NOT_READY reason), is not "down": the call goes to
// the next candidate (another member, or seed), or to the same node again
// after a short backoff, while its deadline leaves room. A call that
// provably never reached a server (connection refused) goes to the key's
// next owner likewise. A call that timed out, which may have spent tokens,
// is never resent. A single fresh node decides from its first rule write
// on.
//
// Failover. A circuit breaker per node opens after 3 failures in a row.
// While a key's owner's breaker is open, the key's calls go to its next
// owner in rendezvous order among the members the client believes live,
// naming the owner in the x-tokenserver-avoid header so that the node
// decides the key itself; a node that cannot reach a key's owner does the
// same. That next owner is the owner the view gives the key once it drops
// the failed node, so the key moves once. Members that left the view are
// named in the header for 5 s, so servers whose view is older do not send
// their keys back to them; a member that leaves the view gets no new
// calls, but the calls already on it (it still answers while it drains)
// are answered before its connection closes. The prober retries a failing node with
// full-jitter backoff, 50ms to 250ms while the view lists it (up to 5s
// otherwise), and closes the breaker when the node answers as ready: a
// node that comes back is used again at once if it is still in the view,
// and otherwise when the view takes it back (after the cluster's
// --up-after hysteresis). Connections use gRPC keepalive. Servers send the
// view on WatchClusterView at least every second; a stream on which no
// ready view arrives for 2s (DefaultWatchSilence) is moved to another
// member.
//
// Over-admission. 0 while every node is healthy (leases included). A key
// that moves to its next owner (a failed, frozen or departed owner) starts
// a fresh bucket there: at most one bucket's worth (its burst) more than
// the rule per move. While two owners answer for one key (a partition, or
// a frozen owner that some clients still reach), admission for it is up to
// 2x the limit for as long as that lasts. During client fallback, the
// fallback policy's rate.
//
// Fallback. When no server can decide a call within the call timeout
// (WithCallTimeout, default 50ms): the owner and its next owner do not
// answer in time, answer Unavailable, or every member is down, the call
// is decided locally under the rule's fallback policy:
// LOCAL throttles each (rule, key) with a golang.org/x/time/rate limiter at
// fallback.limit per rule period for this client instance; ALLOW admits;
// DENY refuses with ErrUnavailable. Until the client has learned the rule,
// the Limiter's WithFallback option decides; when neither does, the call
// is allowed (counted in tokenserver_client_fallback_default_allow_total).
// During fallback the over-admission is therefore bounded by the policy:
// at most fallback.limit per period (plus its burst) per client instance
// and key for LOCAL. A server denial is never turned into a local allow. A
// caller is never blocked longer than its deadline because the server is
// down.
//
// The bucket cap. A node at its bucket cap answers a new key
// ResourceExhausted. That is not an unreachable server: the server
// answered, and one client flooding distinct keys can fill a rule's share
// and keep it full. So the rule's fallback policy (or the Limiter's
// WithFallback option) decides, and when neither is known the call is
// denied with ErrUnavailable, never allowed by default. The trade-off:
// legitimate new keys are refused while the flood lasts, rather than
// admitted without any limit; a rule whose operators prefer availability
// sets fallback ALLOW (or LOCAL with a per-instance limit) and gets it.
//
// Credentials refused. A server that refuses the client's credentials
// (Unauthenticated: a wrong or revoked token; PermissionDenied: a token or
// certificate without the client role; a TLS handshake that fails
// verification, such as an x509 name mismatch or an unknown CA) answered:
// the client is misconfigured. New returns the refusal (an *AuthError,
// ErrAuth for errors.Is, with the gRPC status inside) when no seed gave a
// view, and every call returns it, denied; the fallback policy never turns
// it into an allow, and it does not count as a node failure. It is
// logged at error once and counted in
// tokenserver_client_auth_refused_total.
//
// Start-up. New logs "entering fallback" at warn only when its wait ends
// without a view; later, only when a client that had a server loses every
// member.
//
// Limiters. Client.Limiter returns one Limiter per rule; a second call
// with other options keeps the first options, logs the conflict at warn
// and counts it in tokenserver_client_limiter_option_conflicts_total
// (LimiterE returns ErrLimiterOptions instead).
//
// Unknown rules. A rule the server says does not exist is decided by the
// Limiter's WithFallback option, else allowed, and the call returns
// ErrNotFound; it is logged once per Limiter at warn and counted in
// tokenserver_client_unknown_rule_total.
//
// A Client and its Limiters are safe for simultaneous use by multiple
// goroutines. Create one Client per process and one Limiter per rule, and
// reuse them.
package client

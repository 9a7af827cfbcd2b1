// Package envoyrls is the core of tokenserver's Envoy Rate Limit Service
// (RLS v3): envoyproxy/ratelimit's configuration, its matching, windows,
// request validation, answers, metrics and /json endpoint, without the
// counters, which a Decider supplies.
//
// It is written by hand after the reference implementation's semantics
// (envoyproxy/ratelimit), not imported from it: the reference is a server
// with Redis, globals and panics for errors, while tokenserver needs the same
// answers as pure, testable functions over an immutable Config that Raft can
// replicate.
package envoyrls

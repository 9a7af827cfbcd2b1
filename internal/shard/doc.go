// Package shard keeps a node's buckets: one per (rule, key), in shards
// created on first use, evicted once back at their initial state, under a
// node-wide cap.
//
// The files follow its jobs: map.go the Map, its entries and their lookup;
// table.go the lock-free index of one shard; decide.go the decision
// (lists, penalty, lease share, the algorithm); budget.go the caps and the
// per-generation accounts; migrate.go a bucket's move to a newer rule
// version; refill.go refills, lease renewals and the refilled-grant
// record; sweep.go eviction. Grant ids are sealed by package grant.
//
// # Invariants
//
//   - A bucket is judged by the newest rule version known to its request
//     or to the bucket: its rule only moves forward (resolve), and a
//     request re-reads the current version under the bucket's lock, so a
//     superseded or deleted version never decides.
//   - A bucket of another generation than the deciding rule starts fresh;
//     one of the same generation and algorithm keeps its state, clamped to
//     the new capacity.
//   - A bucket is dropped only when idle (at its initial state, no
//     penalty, no grant that could be refilled twice) or when its rule
//     generation is gone; a dropped entry's rule is nil, and a lookup
//     that finds it looks again. Dropping an idle bucket is exact: a new
//     one later decides the same. So a rule at its fair share of the
//     budget evicts its own least recently used idle ("full") buckets
//     before it refuses a new key, which takes their place (sweep.go);
//     when none is idle, the key is refused (ErrBucketCap), since
//     dropping a bucket with state would reset its key.
//   - Every live bucket counts once in the node's counts (live buckets,
//     bytes) and in the account of its rule generation (keys, bytes):
//     a new key is admitted against the node's cap, the budget, the rule's
//     fair share and its max_keys before its bucket exists, and every
//     change of a bucket's memory is charged where it happens. After a
//     sweep that drops every bucket, all counts are zero.
//   - A grant is given back at most once, never after it could have
//     expired, and never to a bucket made after it (grant nonces of a key
//     only grow across its buckets).
//
// # Locking
//
// Each bucket has its own mutex, and a shard's index is read without a
// lock (see table), so a decision writes only its own bucket's cache
// lines; a shard's mutex serializes inserts, evictions and growth of that
// shard's index. Locks are taken in this order, never the reverse:
//
//  1. a shard's mu (insert, eviction, sweep; one shard at a time);
//  2. an entry's mu (one entry at a time);
//  3. the accounts' lock (pin, briefly; nothing else is taken under it).
//
// A decision on an existing bucket takes only 2 (and 3 when the bucket's
// memory changes); a new key takes 1, then 3 to be admitted, then its new
// bucket's 2. The rule table is read through atomic pointers and needs no
// lock.
package shard

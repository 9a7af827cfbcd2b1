// Package cluster decides key ownership: which member of the routing view
// holds a key's buckets, by rendezvous hashing of the key over the members,
// the same in every server and client.
//
// Rendezvous (highest random weight) hashing is a few lines and needs no
// ring or virtual nodes: each key goes to the member with the highest
// score(member, key), so removing a member moves only its own keys and
// adding one moves about 1/N of the keys to it. The hash is fixed (FNV-1a
// with a 64-bit finalizer) so that every process, of any version, agrees.
package cluster

import (
	"sort"
)

// Member is one node of the routing view.
type Member struct {
	// ID is the node id, unique in the cluster.
	ID string
	// GRPCAddr is the address clients and other nodes dial.
	GRPCAddr string
	// RaftAddr is the advertised Raft address.
	RaftAddr string
	// Voter reports whether the node votes in Raft.
	Voter bool
}

// View is an immutable routing view: the members that own keys, and the
// epoch that changes whenever the set of owners changes. The zero View has
// no members.
type View struct {
	// Epoch identifies this ownership map.
	Epoch   uint64
	members []Member
	seeds   []uint64
}

// NewView returns a view of members (sorted by ID; duplicates by ID keep the
// first) at epoch.
func NewView(epoch uint64, members []Member) *View {
	ms := append([]Member(nil), members...)
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	out := ms[:0]
	for i, m := range ms {
		if i > 0 && m.ID == ms[i-1].ID {
			continue
		}
		out = append(out, m)
	}
	v := &View{Epoch: epoch, members: out, seeds: make([]uint64, len(out))}
	for i, m := range out {
		v.seeds[i] = mix(hashString(m.ID))
	}
	return v
}

// Members returns the view's members sorted by ID. Do not modify them.
func (v *View) Members() []Member {
	if v == nil {
		return nil
	}
	return v.members
}

// Len is the number of members.
func (v *View) Len() int {
	if v == nil {
		return 0
	}
	return len(v.members)
}

// Member returns the member with that id.
func (v *View) Member(id string) (Member, bool) {
	for _, m := range v.Members() {
		if m.ID == id {
			return m, true
		}
	}
	return Member{}, false
}

// Owner returns the member that owns key; false when the view is empty.
func (v *View) Owner(key string) (Member, bool) {
	if v.Len() == 0 {
		return Member{}, false
	}
	return v.members[v.ownerIndex(KeyHash(key))], true
}

// OwnerOfHash is Owner for a key already hashed with KeyHash.
func (v *View) OwnerOfHash(h uint64) (Member, bool) {
	if v.Len() == 0 {
		return Member{}, false
	}
	return v.members[v.ownerIndex(h)], true
}

// OwnerExcept returns the owner of a key already hashed with KeyHash among
// the members for which skip returns false: the next owner in rendezvous
// order when the first ones are skipped. It is what a key's ownership
// becomes once the view drops the skipped members, so a key moved this way
// while its owner is down moves once. False when every member is skipped
// or the view is empty. skip may be nil; it is called once per member.
func (v *View) OwnerExcept(h uint64, skip func(id string) bool) (Member, bool) {
	best, bestScore, found := 0, uint64(0), false
	for i, s := range v.seedsOrNil() {
		if skip != nil && skip(v.members[i].ID) {
			continue
		}
		if score := mix(h ^ s); !found || score > bestScore {
			best, bestScore, found = i, score, true
		}
	}
	if !found {
		return Member{}, false
	}
	return v.members[best], true
}

func (v *View) seedsOrNil() []uint64 {
	if v == nil {
		return nil
	}
	return v.seeds
}

func (v *View) ownerIndex(h uint64) int {
	best, bestScore := 0, uint64(0)
	for i, s := range v.seeds {
		if score := mix(h ^ s); score > bestScore || i == 0 {
			best, bestScore = i, score
		}
	}
	return best
}

// Equal reports whether two views have the same members (IDs and
// addresses), whatever their epochs.
func (v *View) Equal(o *View) bool {
	a, b := v.Members(), o.Members()
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// KeyHash hashes a key for ownership: 64-bit FNV-1a.
func KeyHash(key string) uint64 {
	return hashString(key)
}

func hashString(s string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime
	}
	return h
}

// mix is the splitmix64 finalizer: it spreads FNV's weak low bits.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

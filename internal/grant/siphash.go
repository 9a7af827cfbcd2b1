package grant

import (
	"encoding/binary"
	"math/bits"
)

// SipHash-2-4 (Aumasson and Bernstein), as in the reference
// implementation, split into steps so that a tag can feed fixed-width
// fields into the state without first copying them into one buffer.

// sipInit is the state for the key (k0, k1).
func sipInit(k0, k1 uint64) (v0, v1, v2, v3 uint64) {
	return k0 ^ 0x736f6d6570736575, k1 ^ 0x646f72616e646f6d, k0 ^ 0x6c7967656e657261, k1 ^ 0x7465646279746573
}

// sipRound is one SipRound (small enough for the compiler to inline).
func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// sipTail compresses the rest p of a message of n bytes in all (the words
// before p already compressed, so n-len(p) is a multiple of 8) and returns
// the hash.
func sipTail(v0, v1, v2, v3 uint64, p []byte, n int) uint64 {
	for len(p) >= 8 {
		m := binary.LittleEndian.Uint64(p)
		v3 ^= m
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0 ^= m
		p = p[8:]
	}
	var last [8]byte
	copy(last[:], p)
	last[7] = byte(n)
	m := binary.LittleEndian.Uint64(last[:])
	v3 ^= m
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= m
	v2 ^= 0xff
	for range 4 {
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	}
	return v0 ^ v1 ^ v2 ^ v3
}

// siphash is SipHash-2-4 of p under the key (k0, k1).
func siphash(k0, k1 uint64, p []byte) uint64 {
	v0, v1, v2, v3 := sipInit(k0, k1)
	return sipTail(v0, v1, v2, v3, p, len(p))
}

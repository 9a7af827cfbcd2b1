package grant

import (
	"encoding/binary"
	"fmt"
)

// keysLen is the length of Keys' binary form.
const keysLen = 32

// MarshalBinary encodes the keys, so that a node taking over a key from
// another accepts the grants the other sealed (bucket handoff between
// peers, over mutual TLS only: these are secrets).
func (k Keys) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, keysLen)
	for _, v := range [4]uint64{k.tag[0], k.tag[1], k.mask[0], k.mask[1]} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b, nil
}

// UnmarshalBinary decodes MarshalBinary's form.
func (k *Keys) UnmarshalBinary(b []byte) error {
	if len(b) != keysLen {
		return fmt.Errorf("grant keys: %d bytes, want %d", len(b), keysLen)
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	*k = Keys{tag: [2]uint64{u(0), u(1)}, mask: [2]uint64{u(2), u(3)}}
	return nil
}

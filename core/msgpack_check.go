package core

import (
	"encoding/binary"
	"fmt"
)

// maxMsgpackDepth bounds the nesting of a msgpack value from a peer: the decoder recurses once
// per level.
const maxMsgpackDepth = 512

// checkMsgpack reports whether b is exactly one msgpack value whose every claimed length fits
// in b and whose nesting is at most maxMsgpackDepth. msgpack's decoder sizes slices and maps by
// the length a value claims, so a dozen hostile bytes claiming four billion elements would make
// it allocate until the worker dies; once every claim is checked against the bytes there, what
// it allocates is bounded by a small multiple of len(b).
func checkMsgpack(b []byte) error {
	left := []int{1} // the values still to read at each open level
	i := 0
	need := func(n int) error {
		if n > len(b)-i {
			return fmt.Errorf("a msgpack value at byte %d claims %d bytes, but %d are left", i, n, len(b)-i)
		}
		return nil
	}
	length := func(size int) (int, error) {
		if err := need(size); err != nil {
			return 0, err
		}
		var n uint64
		switch size {
		case 1:
			n = uint64(b[i])
		case 2:
			n = uint64(binary.BigEndian.Uint16(b[i:]))
		default:
			n = uint64(binary.BigEndian.Uint32(b[i:]))
		}
		i += size
		return int(n), nil
	}
	for len(left) > 0 {
		top := len(left) - 1
		if left[top] == 0 {
			left = left[:top]
			continue
		}
		left[top]--
		if err := need(1); err != nil {
			return err
		}
		c := b[i]
		i++
		skip, items := 0, 0
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0: // fixints
		case c <= 0x8f:
			items = 2 * int(c&0x0f)
		case c <= 0x9f:
			items = int(c & 0x0f)
		case c <= 0xbf:
			skip = int(c & 0x1f)
		case c == 0xc0 || c == 0xc2 || c == 0xc3: // nil, false, true
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, err = length(1)
		case c == 0xc5 || c == 0xda:
			skip, err = length(2)
		case c == 0xc6 || c == 0xdb:
			skip, err = length(4)
		case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext8, ext16, ext32: length, then the type
			skip, err = length([]int{1, 2, 4}[c-0xc7])
			skip++
		case c == 0xca || c == 0xce || c == 0xd2: // 4-byte numbers
			skip = 4
		case c == 0xcb || c == 0xcf || c == 0xd3: // 8-byte numbers
			skip = 8
		case c == 0xcc || c == 0xd0:
			skip = 1
		case c == 0xcd || c == 0xd1:
			skip = 2
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: the type, then the data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc:
			items, err = length(2)
		case c == 0xdd:
			items, err = length(4)
		case c == 0xde:
			items, err = length(2)
			items *= 2
		case c == 0xdf:
			items, err = length(4)
			items *= 2
		default: // 0xc1 is never used
			return fmt.Errorf("byte %d is 0x%02x, which starts no msgpack value", i-1, c)
		}
		if err != nil {
			return err
		}
		if err := need(skip); err != nil {
			return err
		}
		i += skip
		if items > 0 {
			// Each item takes at least a byte.
			if err := need(items); err != nil {
				return err
			}
			if len(left) >= maxMsgpackDepth {
				return fmt.Errorf("a msgpack value nested more than %d deep", maxMsgpackDepth)
			}
			left = append(left, items)
		}
	}
	if i != len(b) {
		return fmt.Errorf("%d bytes follow the msgpack value", len(b)-i)
	}
	return nil
}

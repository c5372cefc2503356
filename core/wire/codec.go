package wire

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"

	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc/mem"
)

// frameFields is the length of the msgpack array a Frame is encoded as.
const frameFields = 12

// maxDecodedBytes bounds a byte string decoded into fresh memory: bigger data travels in
// chunks, so a frame announcing more is hostile and is refused before anything is allocated.
const maxDecodedBytes = 64 << 20

// decodeStep is how much of a byte string is read, and allocated, at a time.
const decodeStep = 1 << 20

// Nothing here decodes a string, a byte string or an unknown value with msgpack's own methods
// (DecodeString, DecodeBytes, Skip, or Decode into a struct): they read into the decoder's
// own buffer, which grows by at least 1 MiB and a quarter for every field that claims more
// bytes than it carries, and keeps that size. Streams and gRPC's codec reuse decoders, so a
// peer sending short frames that claim gigabytes grew a worker's memory without bound (found
// by FuzzFrameDecode: 6.9 GB after 30 s). Every field is read into fresh memory instead,
// bounded and grown only as its bytes arrive.

// EncodeMsgpack writes f as a msgpack array. Written by hand: it is on every call's path, and
// the decoder below must agree with it field by field.
func (f *Frame) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := f.encodeHead(enc); err != nil {
		return err
	}
	if err := enc.EncodeBytes(f.Payload); err != nil {
		return err
	}
	if err := enc.EncodeArrayLen(len(f.Buffers)); err != nil {
		return err
	}
	for _, b := range f.Buffers {
		if err := enc.EncodeBytes(b); err != nil {
			return err
		}
	}
	return f.encodeTail(enc)
}

// encodeTail writes the fields after the buffers.
func (f *Frame) encodeTail(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(len(f.Refs)); err != nil {
		return err
	}
	for i := range f.Refs {
		if err := enc.Encode(&f.Refs[i]); err != nil {
			return err
		}
	}
	if err := enc.EncodeArrayLen(len(f.Sizes)); err != nil {
		return err
	}
	for _, n := range f.Sizes {
		if err := enc.EncodeInt64(n); err != nil {
			return err
		}
	}
	return enc.EncodeUint(f.RefSeq) // compact: zero on most frames
}

// encodeHead writes the array header and the fields before the payload.
func (f *Frame) encodeHead(enc *msgpack.Encoder) error {
	for _, err := range []error{
		enc.EncodeArrayLen(frameFields),
		enc.EncodeUint8(uint8(f.Kind)),
		enc.EncodeUint64(f.ID),
		enc.EncodeString(f.Method),
		enc.EncodeInt64(f.TimeoutMs),
		enc.EncodeUint8(uint8(f.Status)),
		enc.EncodeString(f.Error),
		enc.EncodeInt64(f.Offset),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// MarshalBuffers encodes a chunk frame with its bytes copied into pooled memory that gRPC
// recycles once written: chunks are most of the bytes sent, and encoding them into fresh
// slices would leave the garbage collector a message's worth of garbage per message.
func (f *Frame) MarshalBuffers(pool mem.BufferPool) (mem.BufferSlice, bool, error) {
	if f.Kind != FrameChunk || len(f.Buffers) > 0 || len(f.Refs) > 0 || len(f.Sizes) > 0 {
		return nil, false, nil
	}
	var head bytes.Buffer
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(&head)
	if err := f.encodeHead(enc); err != nil {
		return nil, true, err
	}
	if err := enc.EncodeBytesLen(len(f.Payload)); err != nil {
		return nil, true, err
	}
	// The payload is followed by the empty buffers, refs and sizes arrays and a zero RefSeq.
	emptyArrays := mem.SliceBuffer{0x90, 0x90, 0x90, 0x00}
	return mem.BufferSlice{mem.SliceBuffer(head.Bytes()), mem.Copy(f.Payload, pool), emptyArrays}, true, nil
}

// DecodeMsgpack reads what EncodeMsgpack wrote. A chunk's bytes go straight to the place its
// stream's reassembler gives (Sink), instead of through a fresh slice.
func (f *Frame) DecodeMsgpack(dec *msgpack.Decoder) error {
	if err := f.decode(dec); err != nil {
		// A frame that failed to decode gives back the pooled memory it took.
		if recycle := f.TakeRecycle(); recycle != nil {
			recycle()
		}
		return err
	}
	return nil
}

func (f *Frame) decode(dec *msgpack.Decoder) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n != frameFields {
		return fmt.Errorf("frame has %d fields, want %d", n, frameFields)
	}
	var kind, status uint8
	if kind, err = dec.DecodeUint8(); err != nil {
		return err
	}
	f.Kind = FrameKind(kind)
	if f.ID, err = dec.DecodeUint64(); err != nil {
		return err
	}
	if f.Method, err = decodeString(dec, "method", maxDecodedBytes); err != nil {
		return err
	}
	if f.TimeoutMs, err = dec.DecodeInt64(); err != nil {
		return err
	}
	if status, err = dec.DecodeUint8(); err != nil {
		return err
	}
	f.Status = ReplyStatus(status)
	if f.Error, err = decodeString(dec, "error", maxDecodedBytes); err != nil {
		return err
	}
	if f.Offset, err = dec.DecodeInt64(); err != nil {
		return err
	}
	if f.Payload, err = f.decodePayload(dec); err != nil {
		return err
	}
	if n, err = decodeLen(dec, "buffers", MaxBuffersPerMessage); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		b, err := f.decodeSegment(dec)
		if err != nil {
			return err
		}
		f.Buffers = append(f.Buffers, b)
	}
	if n, err = decodeLen(dec, "refs", MaxBuffersPerMessage); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		op, err := decodeRefOp(dec)
		if err != nil {
			return err
		}
		f.Refs = append(f.Refs, op)
	}
	if n, err = decodeLen(dec, "sizes", MaxBuffersPerMessage); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		size, err := dec.DecodeInt64()
		if err != nil {
			return err
		}
		f.Sizes = append(f.Sizes, size)
	}
	if f.RefSeq, err = dec.DecodeUint64(); err != nil {
		return err
	}
	return nil
}

// decodeSegment reads the payload or a buffer: a long one into pooled memory that f keeps
// (TakeRecycle), the others into fresh memory.
func (f *Frame) decodeSegment(dec *msgpack.Decoder) ([]byte, error) {
	n, err := dec.DecodeBytesLen()
	if err != nil || n < 0 {
		return nil, err
	}
	// Up to decodeStep: longer ones only come in chunks.
	if n < bufpool.MinPooled || n > decodeStep {
		return readBoundedLen(dec, n)
	}
	b := bufpool.Shared.Get(n)
	f.pooled = append(f.pooled, b)
	if err := dec.ReadFull(b); err != nil {
		return nil, err
	}
	return b[:n:n], nil
}

// TakeRecycle hands over the pooled memory f's payload and buffers were decoded into: the
// returned function gives it back to the shared pool, once however often it is called, and
// must be called only when nothing uses them any more. Nil if none of them is pooled.
func (f *Frame) TakeRecycle() func() {
	pooled := f.pooled
	if len(pooled) == 0 {
		return nil
	}
	f.pooled = nil
	return bufpool.Shared.PutOnce(pooled...)
}

func (f *Frame) decodePayload(dec *msgpack.Decoder) ([]byte, error) {
	if f.Kind != FrameChunk || f.Sink == nil {
		return f.decodeSegment(dec)
	}
	n, err := dec.DecodeBytesLen()
	if err != nil || n < 0 {
		return nil, err
	}
	dst, ok := f.Sink(f.ID, f.Offset, n)
	if !ok {
		return nil, fmt.Errorf("chunk of message %d at %d+%d does not fit a message being received", f.ID, f.Offset, n)
	}
	if dst == nil {
		// A refused message's chunk: its bytes are read and dropped, its length still counts.
		if err := skipBytes(dec, n); err != nil {
			return nil, err
		}
		f.placed, f.dropped = true, n
		return nil, nil
	}
	if err := dec.ReadFull(dst); err != nil {
		return nil, err
	}
	f.placed = true
	return dst, nil
}

// skipBytes reads n bytes and drops them.
func skipBytes(dec *msgpack.Decoder, n int) error {
	var scratch [4096]byte
	for n > 0 {
		k := min(n, len(scratch))
		if err := dec.ReadFull(scratch[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func decodeLen(dec *msgpack.Decoder, what string, limit int) (int, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > limit {
		return 0, fmt.Errorf("frame announces %d %s, more than %d", n, what, limit)
	}
	return max(n, 0), nil
}

// decodeString reads a string of at most limit bytes into fresh memory.
func decodeString(dec *msgpack.Decoder, what string, limit int) (string, error) {
	n, err := dec.DecodeBytesLen()
	if err != nil || n < 0 {
		return "", err
	}
	if n > limit {
		return "", fmt.Errorf("frame announces a %d-byte %s, more than %d", n, what, limit)
	}
	b, err := readBounded(dec, n)
	return string(b), err
}

// decodeRefOp reads a RefOp as RefOp's msgpack form writes it: [kind, [creator, local],
// [creator, local], holder].
func decodeRefOp(dec *msgpack.Decoder) (RefOp, error) {
	var op RefOp
	if err := decodeArrayOf(dec, "reference operation", 5); err != nil {
		return op, err
	}
	kind, err := dec.DecodeUint8()
	if err != nil {
		return op, err
	}
	op.Kind = RefOpKind(kind)
	for _, id := range []*RRefID{&op.RRef, &op.Fork} {
		if err := decodeArrayOf(dec, "RRef id", 2); err != nil {
			return op, err
		}
		if id.Creator, err = dec.DecodeInt(); err != nil {
			return op, err
		}
		if id.Local, err = dec.DecodeInt64(); err != nil {
			return op, err
		}
	}
	if op.Holder, err = dec.DecodeInt(); err != nil {
		return op, err
	}
	op.HolderEpoch, err = dec.DecodeUint64()
	return op, err
}

// decodeArrayOf reads an array header that must announce exactly n items.
func decodeArrayOf(dec *msgpack.Decoder, what string, n int) error {
	got, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("a %s has %d fields, want %d", what, got, n)
	}
	return nil
}

// readBoundedLen reads a byte string of n bytes, whose length was just read, into fresh memory.
func readBoundedLen(dec *msgpack.Decoder, n int) ([]byte, error) {
	if n > maxDecodedBytes {
		return nil, fmt.Errorf("frame announces a %d-byte field, more than %d", n, maxDecodedBytes)
	}
	return readBounded(dec, n)
}

// readBounded reads n bytes into fresh memory grown as they arrive, so a field that claims
// more than it carries costs little.
func readBounded(dec *msgpack.Decoder, n int) ([]byte, error) {
	b := make([]byte, 0, min(n, decodeStep))
	for len(b) < n {
		k := min(n-len(b), decodeStep)
		b = slices.Grow(b, k)[:len(b)+k]
		if err := dec.ReadFull(b[len(b)-k:]); err != nil {
			return nil, err
		}
	}
	return b, nil
}

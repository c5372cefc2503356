// Package msgpackcodec is the gRPC codec that puts every tensorplay-rpc message on the wire as msgpack.
package msgpackcodec

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc/mem"
)

// Name is the gRPC content subtype of the codec ("application/grpc+msgpack").
const Name = "msgpack"

// Codec marshals any msgpack-encodable value. It is a gRPC CodecV2: it decodes straight from
// gRPC's receive buffers, so a value can place big byte strings where it wants them (see
// core.Frame) instead of having the whole message copied into one slice first. It is safe for
// concurrent use.
type Codec struct{}

// BufferMarshaler is implemented by values that encode themselves into gRPC buffers, to put
// big byte strings in pooled memory gRPC recycles instead of in garbage.
type BufferMarshaler interface {
	// MarshalBuffers returns the encoding, or ok=false to be encoded the usual way.
	MarshalBuffers(pool mem.BufferPool) (out mem.BufferSlice, ok bool, err error)
}

// Marshal encodes v as msgpack.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if bm, ok := v.(BufferMarshaler); ok {
		out, ok, err := bm.MarshalBuffers(mem.DefaultBufferPool())
		if ok || err != nil {
			return out, err
		}
	}
	b, err := msgpack.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("msgpack encode %T: %w", v, err)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

// Unmarshal decodes msgpack data into v.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	dec := msgpack.GetDecoder()
	defer msgpack.PutDecoder(dec)
	dec.Reset(data.Reader())
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("msgpack decode %T: %w", v, err)
	}
	return nil
}

// Name returns the codec's content subtype.
func (Codec) Name() string { return Name }

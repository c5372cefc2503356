// Package msgpackcodec is the gRPC codec that puts every tensorplay-rpc message on the wire as msgpack.
package msgpackcodec

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Name is the gRPC content subtype of the codec ("application/grpc+msgpack").
const Name = "msgpack"

// Codec marshals any msgpack-encodable value. It is safe for concurrent use.
type Codec struct{}

// Marshal encodes v as msgpack.
func (Codec) Marshal(v any) ([]byte, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("msgpack encode %T: %w", v, err)
	}
	return b, nil
}

// Unmarshal decodes msgpack data into v.
func (Codec) Unmarshal(data []byte, v any) error {
	if err := msgpack.Unmarshal(data, v); err != nil {
		return fmt.Errorf("msgpack decode %T: %w", v, err)
	}
	return nil
}

// Name returns the codec's content subtype.
func (Codec) Name() string { return Name }

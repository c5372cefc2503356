package wire

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// A stream decodes every frame with one long-lived decoder (shm lanes; gRPC's codec reuses
// pooled ones). Frames that claim huge fields but carry a few bytes must cost each a few
// bytes, not grow a buffer the decoder keeps.
func TestShortFramesClaimingHugeFieldsCostLittle(t *testing.T) {
	claims := func(head ...byte) []byte { return append(head, 0xdb, 0xdb, 0xdb, 0xdb, 'x') } // str32 of 3.7 GB, 1 byte sent
	tests := []struct {
		name   string
		frame  []byte
		decode func(dec *msgpack.Decoder) error
	}{
		{"method", claims(0x9c, 0x01, 0x00), decodeFrame},
		{"error", claims(0x9c, 0x01, 0x00, 0xa0, 0x00, 0x00), decodeFrame},
		// A reference operation with a fifth field is refused, not skipped into the decoder's buffer.
		{"extra field of a reference operation", claims(0x9c, 0x01, 0x00, 0xa0, 0x00, 0x00, 0xa0, 0x00, 0xc4, 0x00, 0x90, 0x91, 0x95, 0x01, 0x92, 0x00, 0x00, 0x92, 0x00, 0x00, 0x00), decodeFrame},
		{"hello name", claims(0x92), func(dec *msgpack.Decoder) error {
			payload, _ := readAll(dec)
			_, err := (&Frame{Kind: FrameHello, Payload: payload}).Hello()
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dec := msgpack.NewDecoder(nil)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 200 {
				dec.Reset(bytes.NewReader(tt.frame))
				if err := tt.decode(dec); err == nil {
					t.Fatal("a frame that claims 3.7 GB and carries 1 byte decoded")
				}
			}
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Fatalf("200 short frames cost %d MiB of allocations", grew>>20)
			}
		})
	}
}

func decodeFrame(dec *msgpack.Decoder) error {
	var f Frame
	return f.DecodeMsgpack(dec)
}

// readAll reads what is left of dec's input.
func readAll(dec *msgpack.Decoder) ([]byte, error) {
	var out []byte
	var one [1]byte
	for dec.ReadFull(one[:]) == nil {
		out = append(out, one[0])
	}
	return out, nil
}

package wire

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzFrameDecode feeds arbitrary bytes to the frame decoder, as a hostile peer could: it must
// fail cleanly, never panic, and never allocate what a frame merely claims. Decodable frames
// must survive a round trip. (core's FuzzReassembly takes sequences of frames further.)
func FuzzFrameDecode(f *testing.F) {
	for _, fr := range []*Frame{
		HelloFrame("w0", 0, 0),
		{Kind: FrameRequest, ID: 7, Method: "py", TimeoutMs: 100, Payload: []byte("pickle"), Buffers: [][]byte{{1, 2}, {}}},
		{Kind: FrameResponse, ID: 7, Status: ReplyHandlerError, Error: "boom", Payload: []byte("detail")},
		{Kind: FrameRequest, ID: 8, Method: "py", Sizes: []int64{10, 1 << 20}},
		{Kind: FrameChunk, ID: 8, Offset: 4096, Payload: bytes.Repeat([]byte{9}, 64)},
		{Kind: FrameAbort, ID: 8},
		{Kind: FrameRefs, Refs: []RefOp{{Kind: RefAdd, RRef: RRefID{Creator: 1, Local: 2}, Fork: ForkID{Creator: 1, Local: 3}, Holder: 2}}},
	} {
		b, err := msgpack.Marshal(fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fr Frame
		if err := msgpack.Unmarshal(data, &fr); err != nil {
			return
		}
		again, err := msgpack.Marshal(&fr)
		if err != nil {
			t.Fatalf("re-encoding a decoded frame: %v", err)
		}
		var back Frame
		if err := msgpack.Unmarshal(again, &back); err != nil {
			t.Fatalf("decoding a re-encoded frame: %v", err)
		}
		if back.Kind != fr.Kind || back.ID != fr.ID || !bytes.Equal(back.Payload, fr.Payload) || len(back.Sizes) != len(fr.Sizes) {
			t.Fatal("a frame changed in a round trip")
		}
	})
}

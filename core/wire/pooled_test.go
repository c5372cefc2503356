package wire

import (
	"bytes"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"
	"github.com/vmihailenco/msgpack/v5"
)

func encodeFrame(t *testing.T, f *Frame) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := f.EncodeMsgpack(msgpack.NewEncoder(&out)); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func filled(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

func TestLongSegmentsAreDecodedIntoPooledMemoryGivenBackOnce(t *testing.T) {
	sent := &Frame{Kind: FrameRequest, ID: 7, Payload: filled(100<<10, 1), Buffers: [][]byte{filled(200<<10, 2), filled(1<<10, 3)}}
	got := &Frame{}
	if err := got.DecodeMsgpack(msgpack.NewDecoder(bytes.NewReader(encodeFrame(t, sent)))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Payload, sent.Payload) || len(got.Buffers) != 2 || !bytes.Equal(got.Buffers[0], sent.Buffers[0]) || !bytes.Equal(got.Buffers[1], sent.Buffers[1]) {
		t.Fatal("the frame decoded differs from the one sent")
	}
	before := bufpool.Shared.Idle()
	recycle := got.TakeRecycle()
	if recycle == nil || got.TakeRecycle() != nil {
		t.Fatal("TakeRecycle: want the pooled memory handed over once")
	}
	recycle()
	recycle()
	// The payload's and the first buffer's pooled buffers (128 and 256 KiB); the 1 KiB buffer is
	// fresh memory.
	if back := bufpool.Shared.Idle() - before; back != 384<<10 {
		t.Fatalf("%d bytes went back to the pool, want %d", back, 384<<10)
	}
}

func TestFieldsThatArePooledOrNot(t *testing.T) {
	tests := []struct {
		name   string
		length int
		pooled bool
	}{
		{"short", bufpool.MinPooled - 1, false},
		{"long", bufpool.MinPooled, true},
		{"longest decoded whole", decodeStep, true},
		{"longer than any chunk", decodeStep + 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := &Frame{}
			if err := got.DecodeMsgpack(msgpack.NewDecoder(bytes.NewReader(encodeFrame(t, &Frame{Kind: FrameResponse, Payload: filled(tt.length, 5)})))); err != nil {
				t.Fatal(err)
			}
			if recycle := got.TakeRecycle(); (recycle != nil) != tt.pooled {
				t.Fatalf("a %d-byte payload pooled: %v, want %v", tt.length, recycle != nil, tt.pooled)
			}
		})
	}
}

func TestAFrameCutShortGivesItsPooledMemoryBack(t *testing.T) {
	whole := encodeFrame(t, &Frame{Kind: FrameRequest, Payload: filled(100<<10, 1), Buffers: [][]byte{filled(200<<10, 2)}})
	tests := []struct {
		name string
		cut  int // bytes cut off the end
	}{
		{"in its buffer", 100 << 10},
		{"after its buffers", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Free buffers of both sizes, for the decoder to take: the pool then holds as much
			// again only if it gets them back.
			bufpool.Shared.Put(make([]byte, 128<<10))
			bufpool.Shared.Put(make([]byte, 256<<10))
			before := bufpool.Shared.Idle()
			got := &Frame{}
			if err := got.DecodeMsgpack(msgpack.NewDecoder(bytes.NewReader(whole[:len(whole)-tt.cut]))); err == nil {
				t.Fatal("a frame cut short decoded")
			}
			if got.TakeRecycle() != nil {
				t.Fatal("the failed frame still holds pooled memory")
			}
			if idle := bufpool.Shared.Idle(); idle != before {
				t.Fatalf("the pool holds %d bytes after the failed decode, %d before it", idle, before)
			}
		})
	}
}

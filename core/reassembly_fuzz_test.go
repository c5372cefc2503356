package core

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// encodeFrames is a stream's bytes for frames, as msgpack values back to back.
func encodeFrames(t testing.TB, frames ...*wire.Frame) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	for _, f := range frames {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// FuzzReassembly feeds sequences of frames, as a hostile peer could send them on one stream,
// through the decoder with the reassembler's chunk sink attached (as the gRPC stream decodes
// them) and into the reassembler: announced sizes, offsets and lengths of every kind must be
// refused cleanly, never panic, never make one stream wait for memory it holds itself, and
// leave nothing reserved once the stream ends.
func FuzzReassembly(f *testing.F) {
	payload := bytes.Repeat([]byte{7}, 64)
	seeds := [][]*wire.Frame{
		{ // a message in two chunks, then a small one
			{Kind: wire.FrameRequest, ID: 1, Method: "py", Sizes: []int64{40, 24}},
			{Kind: wire.FrameChunk, ID: 1, Offset: 0, Payload: payload[:40]},
			{Kind: wire.FrameChunk, ID: 1, Offset: 40, Payload: payload[:24]},
			{Kind: wire.FrameRequest, ID: 2, Method: "py", Payload: []byte("small")},
		},
		{ // sizes whose sum wraps past int64, then a chunk
			{Kind: wire.FrameRequest, ID: 3, Sizes: []int64{1, math.MaxInt64, math.MaxInt64, 2}},
			{Kind: wire.FrameChunk, ID: 3, Offset: 0, Payload: payload[:1]},
		},
		{ // offsets near the end of int64
			{Kind: wire.FrameResponse, ID: 4, Sizes: []int64{64}},
			{Kind: wire.FrameChunk, ID: 4, Offset: math.MaxInt64 - 2, Payload: payload[:8]},
			{Kind: wire.FrameChunk, ID: 4, Offset: -1, Payload: payload[:8]},
		},
		{ // a message over the limit, dropped chunk by chunk, then an abort
			{Kind: wire.FrameRequest, ID: 5, Sizes: []int64{2 << 20}},
			{Kind: wire.FrameChunk, ID: 5, Offset: 0, Payload: payload},
			{Kind: wire.FrameAbort, ID: 5},
		},
		{ // the same chunk twice, and a chunk of an unknown message
			{Kind: wire.FrameRequest, ID: 6, Sizes: []int64{32, 32}},
			{Kind: wire.FrameChunk, ID: 6, Offset: 0, Payload: payload[:32]},
			{Kind: wire.FrameChunk, ID: 6, Offset: 0, Payload: payload[:32]},
			{Kind: wire.FrameChunk, ID: 99, Offset: 0, Payload: payload[:1]},
		},
		{ // two messages taking turns, then an empty one
			{Kind: wire.FrameRequest, ID: 7, Sizes: []int64{16}},
			{Kind: wire.FrameRequest, ID: 8, Sizes: []int64{16}},
			{Kind: wire.FrameChunk, ID: 8, Offset: 0, Payload: payload[:16]},
			{Kind: wire.FrameChunk, ID: 7, Offset: 0, Payload: payload[:16]},
			{Kind: wire.FrameRequest, ID: 9, Sizes: []int64{0}},
		},
	}
	for _, frames := range seeds {
		f.Add(encodeFrames(f, frames...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		budget := newReceiveBudget(1<<20, slog.Default())
		r := newReassembler(ctx, 1<<20, budget, "peer")
		dec := msgpack.NewDecoder(bytes.NewReader(data))
		for i := 0; i < 1000; i++ {
			fr := &wire.Frame{Sink: r.dest}
			if err := dec.Decode(fr); err != nil {
				break
			}
			got, msg, _, err := r.add(fr)
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("one stream waited for receive budget only it holds")
			}
			if err != nil {
				break
			}
			if got != nil && msg.Pooled() {
				msg.Release()
				msg.Release() // twice must be harmless
			}
		}
		r.close()
		if used := budget.inUse(); used != 0 {
			t.Fatalf("%d bytes still reserved after the stream ended", used)
		}
	})
}

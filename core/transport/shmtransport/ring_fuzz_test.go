package shmtransport

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// errNoMoreData ends a fuzzed read where a real reader would sleep on the socket.
var errNoMoreData = errors.New("no more data")

// FuzzRingReader feeds the reader what a hostile peer controls: the write index and the ring's
// bytes. Whatever they are, reading frames must end in frames or errors, never a panic, and
// never read outside the ring.
func FuzzRingReader(f *testing.F) {
	var p wire.Parts
	good, total, _ := p.Encode(&wire.Frame{Kind: wire.FrameRequest, ID: 7, Method: "m", Payload: []byte("hello")})
	seed := binary.LittleEndian.AppendUint32(nil, uint32(total))
	for _, piece := range good {
		seed = append(seed, piece...)
	}
	f.Add(uint64(len(seed)), uint64(0), seed)
	f.Add(uint64(1<<40), uint64(0), seed)
	f.Add(uint64(3), uint64(5), []byte{0xff, 0xff, 0xff, 0x7f})
	f.Add(uint64(len(seed)), uint64(MinRingBytes-3), seed) // a frame that wraps the ring's end
	// A chunk whose bytes are lent (lending.go), from this process's memory.
	mem := fuzzRegion()
	w := &ringWriter{r: ringAt(mem, laneBulk, 0, MinRingBytes), wake: func(uint32) error { return nil }, broken: func() error { return nil }}
	lent, lentTotal, _ := p.Encode(&wire.Frame{Kind: wire.FrameChunk, ID: 7, Payload: make([]byte, minLentBytes)})
	if err := w.writeLending(lent, p.Referenced, lentTotal); err != nil || w.lentTo.Load() == 0 {
		f.Fatalf("no lending frame to start from: %v", err)
	}
	f.Add(w.head, uint64(0), append([]byte(nil), w.r.data[:w.head]...))
	// A big message's header with a landing, then a chunk in it (placing.go).
	w = &ringWriter{r: ringAt(fuzzRegion(), laneBulk, 0, MinRingBytes), wake: func(uint32) error { return nil }, broken: func() error { return nil }}
	head, headTotal, _ := p.Encode(&wire.Frame{Kind: wire.FrameRequest, ID: 7, Method: "m", Sizes: []int64{4096}})
	if err := w.writeLandingHeader(head, headTotal, landingTrailer{slot: 1, off: 8192, n: 4096}); err != nil {
		f.Fatal(err)
	}
	chunk := &wire.Frame{Kind: wire.FrameChunk, ID: 7, Payload: make([]byte, 4096)}
	placed, placedTotal, _ := p.Encode(chunk)
	if err := w.writePlacedChunk(placed, chunk.Payload, 8192, placedTotal); err != nil {
		f.Fatal(err)
	}
	f.Add(w.head, uint64(0), append([]byte(nil), w.r.data[:w.head]...))
	f.Fuzz(func(t *testing.T, written, start uint64, data []byte) {
		mem := fuzzRegion()
		rg := ringAt(mem, laneSmall, 0, MinRingBytes)
		start %= MinRingBytes
		for i, b := range data[:min(len(data), MinRingBytes)] {
			rg.data[(start+uint64(i))%MinRingBytes] = b
		}
		rg.ctrl.head.Store(start + written)
		rg.ctrl.tail.Store(start)
		r := &ringReader{r: rg, tail: start, released: start, head: start, sleep: func() error { return errNoMoreData }, lender: lenderOf(t, os.Getpid()),
			area: mem[ringsBytes(MinRingBytes):], land: func(int) func() { return func() {} }}
		dec := msgpack.NewDecoder(nil)
		sink := func(id uint64, offset int64, n int) ([]byte, bool) { return make([]byte, min(n, 1<<20)), n <= 1<<20 }
		for range 64 {
			if _, err := r.ready(); err != nil {
				return
			}
			if _, err := r.readFrame(dec, sink); err != nil {
				return
			}
		}
	})
}

// fuzzLandingArea is the landing area of a fuzzed region: small, so each run allocates little.
const fuzzLandingArea = 64 << 10

// fuzzRegion is a region's rings for rings of MinRingBytes and a small landing area, in Go
// memory 8-byte aligned as a mapping is (for the fuzz target and tests of the rings alone).
func fuzzRegion() []byte {
	words := make([]uint64, (ringsBytes(MinRingBytes)+fuzzLandingArea)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
}

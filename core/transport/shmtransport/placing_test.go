package shmtransport

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// landingPair opens a stream whose ends take landings, with the receiver's chunks decoded into
// the landings its headers bring (as the core's reassembler does) or into memory of its own.
func landingPair(t *testing.T) (client, server *stream, rx *landingReceiver) {
	t.Helper()
	c, s, err := pair(t, "", "", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	openBulkLane(t, c, s)
	client, server = c.(*stream), s.(*stream)
	rx = &landingReceiver{dst: map[uint64][]byte{}}
	server.SetChunkSink(rx.sink)
	return client, server, rx
}

// landingReceiver keeps, per message, where its chunks go.
type landingReceiver struct {
	mu  sync.Mutex
	dst map[uint64][]byte
}

func (r *landingReceiver) sink(id uint64, offset int64, n int) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dst[id][offset : offset+int64(n)], true
}

// received is a big message as the receiver got it.
type received struct {
	data    []byte
	landed  bool
	release func()
}

// sendBig sends data as message id, a header then chunks of chunk bytes, and receives it.
func sendBig(t *testing.T, from, to *stream, rx *landingReceiver, id uint64, data []byte, chunk int) received {
	t.Helper()
	sent := make(chan error, 1)
	go func() {
		if err := from.Send(&wire.Frame{Kind: wire.FrameRequest, ID: id, Method: "m", Sizes: []int64{int64(len(data))}}); err != nil {
			sent <- err
			return
		}
		for at := 0; at < len(data); at += chunk {
			if err := from.Send(&wire.Frame{Kind: wire.FrameChunk, ID: id, Offset: int64(at), Payload: data[at:min(len(data), at+chunk)]}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	head, err := to.Recv()
	if err != nil {
		t.Fatal(err)
	}
	mem, release := head.TakeLanding()
	got := received{data: mem, landed: mem != nil, release: release}
	if mem == nil {
		got.data = make([]byte, len(data))
		got.release = func() {}
	}
	rx.mu.Lock()
	rx.dst[id] = got.data
	rx.mu.Unlock()
	for n := 0; n < len(data); {
		f, err := to.Recv()
		if err != nil {
			t.Fatal(err)
		}
		k, placed := f.Placed()
		if f.Kind != wire.FrameChunk || !placed {
			t.Fatalf("got a %v frame (placed %v), want a chunk of message %d", f.Kind, placed, id)
		}
		n += k
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.data, data) {
		t.Fatalf("message %d (landed %v) arrived different", id, got.landed)
	}
	return got
}

func offsetIn(area, b []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(&b[0])) - uintptr(unsafe.Pointer(&area[0])))
}

// TestABigMessageIsWrittenIntoItsLanding: big messages are written into a landing that the
// receiver reads in place (the chunks arrive where they already are, the ring carries only
// frames), each given back when released and then reused (the area grows no further), in both
// directions.
func TestABigMessageIsWrittenIntoItsLanding(t *testing.T) {
	const size = 3<<20 + 123
	client, server, rx := landingPair(t)
	srx := &landingReceiver{dst: map[uint64][]byte{}}
	client.SetChunkSink(srx.sink)
	for _, dir := range []struct {
		name     string
		from, to *stream
		rx       *landingReceiver
	}{{"dialer to listener", client, server, rx}, {"listener to dialer", server, client, srx}} {
		t.Run(dir.name, func(t *testing.T) {
			var at []uint64
			for id := uint64(1); id < 4; id++ {
				out := &dir.from.lanes[laneBulk].out
				before := out.head
				got := sendBig(t, dir.from, dir.to, dir.rx, id, randomBytes(t, size), 1<<20)
				if !got.landed {
					t.Fatalf("message %d did not land although the area was warm", id)
				}
				if inRing := out.head - before; inRing > 4096 {
					t.Fatalf("a landed message of %d bytes put %d bytes in the ring", size, inRing)
				}
				area := dir.to.lanes[laneBulk].in.area
				at = append(at, offsetIn(area, got.data))
				slot := dir.to.lanes[laneBulk].in.r.ctrl
				got.release()
				got.release() // a second release gives nothing back twice
				for k := range slot.landings {
					if slot.landings[k].Load() != 0 {
						t.Fatalf("landing slot %d is still held after the release", k)
					}
				}
			}
			if at[0] != 0 || at[1] != 0 || at[2] != 0 {
				t.Fatalf("released landings were not reused: offsets %v", at)
			}
			if warm := dir.from.placer.warm.Load(); warm != alignUp(size) {
				t.Fatalf("the area was populated to %d bytes for landings of %d", warm, size)
			}
		})
	}
}

// TestAHeldLandingIsNotReused: while the receiver holds a message's landing, later messages land
// elsewhere, or travel the old way once the area is full, and the held bytes stay as they were.
func TestAHeldLandingIsNotReused(t *testing.T) {
	const size = 20 << 20 // three fit in the area
	client, server, rx := landingPair(t)
	var held []received
	var kept [][]byte
	for id := uint64(1); id < 12; id++ {
		data := randomBytes(t, size)
		got := sendBig(t, client, server, rx, id, data, 8<<20)
		if got.landed {
			for _, h := range held {
				if offsetIn(server.lanes[laneBulk].in.area, h.data) == offsetIn(server.lanes[laneBulk].in.area, got.data) {
					t.Fatalf("message %d landed where a held one is", id)
				}
			}
			held = append(held, got)
			kept = append(kept, data)
		}
	}
	if len(held) != 3 {
		t.Fatalf("%d messages of %d bytes landed in a %d-byte area, want 3", len(held), size, LandingAreaBytes)
	}
	for i, h := range held {
		if !bytes.Equal(h.data, kept[i]) {
			t.Fatalf("held landing %d was overwritten by a later message", i)
		}
		h.release()
	}
	if got := sendBig(t, client, server, rx, 99, randomBytes(t, size), 8<<20); !got.landed {
		t.Fatal("once the landings were released, the next message did not land")
	}
}

// TestALandingOutlivesItsStream: memory lent from a landing stays mapped after the stream
// ends, until it is released.
func TestALandingOutlivesItsStream(t *testing.T) {
	const size = 2 << 20
	client, server, rx := landingPair(t)
	data := randomBytes(t, size)
	got := sendBig(t, client, server, rx, 2, data, 1<<20)
	if !got.landed {
		t.Fatal("the message did not land")
	}
	client.Close()
	server.Close()
	if !bytes.Equal(got.data, data) { // would fault if unmapped
		t.Fatal("the landing changed when the stream ended")
	}
	server.mu.Lock()
	unmapped := server.unmapped
	server.mu.Unlock()
	if unmapped {
		t.Fatal("the region was unmapped while a landing was held")
	}
	got.release()
	server.mu.Lock()
	unmapped = server.unmapped
	server.mu.Unlock()
	if !unmapped {
		t.Fatal("the region stayed mapped after the last landing was released")
	}
}

// TestHostileLandingsAreRefused: what a peer says of landings is checked before it is used.
func TestHostileLandingsAreRefused(t *testing.T) {
	header := func(t *testing.T, w *ringWriter, f *wire.Frame, l landingTrailer) {
		var parts wire.Parts
		pieces, total, err := parts.Encode(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.writeLandingHeader(pieces, total, l); err != nil {
			t.Fatal(err)
		}
	}
	big := &wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{1 << 20}}
	for _, tc := range []struct {
		name, want string
		write      func(t *testing.T, client *stream)
	}{
		{"a landing past the area", "landing", func(t *testing.T, c *stream) {
			header(t, &c.lanes[laneBulk].out, big, landingTrailer{slot: 0, off: LandingAreaBytes - 4096, n: 1 << 20})
		}},
		{"a landing whose end wraps around", "landing", func(t *testing.T, c *stream) {
			header(t, &c.lanes[laneBulk].out, big, landingTrailer{slot: 0, off: 4096, n: ^uint64(0) - 100})
		}},
		{"a slot out of range", "landing", func(t *testing.T, c *stream) {
			header(t, &c.lanes[laneBulk].out, big, landingTrailer{slot: maxLandings, off: 0, n: 1 << 20})
		}},
		{"a landing of another size than the message", "a landing of", func(t *testing.T, c *stream) {
			header(t, &c.lanes[laneBulk].out, big, landingTrailer{slot: 0, off: 0, n: 1 << 19})
		}},
		{"a landing for a message with no sizes", "a landing of", func(t *testing.T, c *stream) {
			header(t, &c.lanes[laneBulk].out, &wire.Frame{Kind: wire.FrameRequest, ID: 1}, landingTrailer{slot: 0, off: 0, n: 4096})
		}},
		{"a landing in the small lane", "does not take", func(t *testing.T, c *stream) {
			header(t, &c.lanes[laneSmall].out, &wire.Frame{Kind: wire.FrameRequest, ID: 1}, landingTrailer{slot: 0, off: 0, n: 4096})
		}},
		{"a placed chunk past the area", "landing area", func(t *testing.T, c *stream) {
			var parts wire.Parts
			f := &wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: make([]byte, 1<<20)}
			pieces, total, err := parts.Encode(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.lanes[laneBulk].out.writePlacedChunk(pieces, f.Payload, LandingAreaBytes-4096, total); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server, _ := landingPair(t)
			tc.write(t, client)
			f, err := server.Recv()
			if !errors.Is(err, transport.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Recv = %v, %v; want a malformed-frame error about %q", f, err, tc.want)
			}
		})
	}
}

// TestAStreamThatTakesNoLandingsGetsNone: a receiver that does not take landings gets big
// messages the old way, and a landing sent to it anyway is malformed.
func TestAStreamThatTakesNoLandingsGetsNone(t *testing.T) {
	lt, err := New("", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	dt, err := New("", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	lt.noLandings = true
	c, s, err := connect(t, dt, lt)
	if err != nil {
		t.Fatal(err)
	}
	openBulkLane(t, c, s)
	client, server := c.(*stream), s.(*stream)
	rx := &landingReceiver{dst: map[uint64][]byte{}}
	server.SetChunkSink(rx.sink)
	for id := uint64(1); id < 4; id++ {
		if got := sendBig(t, client, server, rx, id, randomBytes(t, 2<<20), 1<<20); got.landed {
			t.Fatalf("message %d landed on a stream that takes no landings", id)
		}
	}
	if client.placer.warm.Load() != 0 {
		t.Fatal("the sender populated a landing area its peer does not take")
	}
	var parts wire.Parts
	pieces, total, err := parts.Encode(&wire.Frame{Kind: wire.FrameRequest, ID: 9, Sizes: []int64{4096}})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.lanes[laneBulk].out.writeLandingHeader(pieces, total, landingTrailer{n: 4096}); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Recv(); !errors.Is(err, transport.ErrMalformed) || !strings.Contains(err.Error(), "does not take") {
		t.Fatalf("Recv = %v; want a malformed-frame error", err)
	}
}

// TestLandingMemoryIsBoundedPerProcess: streams stop populating landing memory once the
// process has populated its bound, and an ended stream's memory counts no more.
func TestLandingMemoryIsBoundedPerProcess(t *testing.T) {
	const size = 6 << 20
	defer func(old int64) { maxWarmLandingBytes = old }(maxWarmLandingBytes)
	maxWarmLandingBytes = warmLandingBytes.Load() + 8<<20 // one stream's landing fits, not two
	c1, s1, rx1 := landingPair(t)
	c2, s2, rx2 := landingPair(t)
	held := sendBig(t, c1, s1, rx1, 1, randomBytes(t, size), 1<<20)
	defer held.release()
	if !held.landed {
		t.Fatal("the first stream's message did not land")
	}
	for id := uint64(1); id < 4; id++ {
		if sendBig(t, c2, s2, rx2, id, randomBytes(t, size), 1<<20).landed {
			t.Fatal("a second stream populated landing memory past the process's bound")
		}
	}
	c1.Close()
	s1.Close()
	if !sendBig(t, c2, s2, rx2, 5, randomBytes(t, size), 1<<20).landed {
		t.Fatal("once the first stream ended, the second still could not populate landing memory")
	}
}

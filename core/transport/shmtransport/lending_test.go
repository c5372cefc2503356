package shmtransport

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"
)

// lendingPair opens a stream between two transports that read what the other lends, or not.
func lendingPair(t *testing.T, lending bool) (client, server *stream) {
	t.Helper()
	lt, err := New("", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	dt, err := New("", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	lt.noLending, dt.noLending = !lending, !lending
	lt.noLandings, dt.noLandings = !lending, !lending
	c, s, err := connect(t, dt, lt)
	if err != nil {
		t.Fatal(err)
	}
	openBulkLane(t, c, s)
	return c.(*stream), s.(*stream)
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBigChunksAreLentNotCopiedIntoTheRing: with lending, a chunk's bytes go from the sender's
// memory straight to the receiver, and the ring carries only the frame around them; without
// it, they go through the ring. Either way they arrive intact, in both directions.
func TestBigChunksAreLentNotCopiedIntoTheRing(t *testing.T) {
	const size = 1 << 20
	for _, lending := range []bool{true, false} {
		client, server := lendingPair(t, lending)
		for _, dir := range []struct {
			name     string
			from, to *stream
		}{{"dialer to listener", client, server}, {"listener to dialer", server, client}} {
			t.Run(fmt.Sprintf("lending %v, %s", lending, dir.name), func(t *testing.T) {
				data := randomBytes(t, size)
				out := &dir.from.lanes[laneBulk].out
				before := out.head
				sent := make(chan error, 1)
				go func() { sent <- dir.from.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 5, Offset: 3, Payload: data}) }()
				got, err := dir.to.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if err := <-sent; err != nil {
					t.Fatal(err)
				}
				if got.Kind != wire.FrameChunk || got.ID != 5 || got.Offset != 3 || !bytes.Equal(got.Payload, data) {
					t.Fatalf("lending %v: the chunk came out different", lending)
				}
				if got, want := dir.from.ChunkBytes(), map[bool]int{true: LentChunkBytes, false: 0}[lending]; got != want {
					t.Fatalf("lending %v: the stream asks for chunks of %d bytes, want %d", lending, got, want)
				}
				inRing := out.head - before
				if lending && inRing > 1024 {
					t.Fatalf("a lent chunk of %d bytes put %d bytes in the ring", size, inRing)
				}
				if !lending && inRing < size {
					t.Fatalf("without lending, a chunk of %d bytes put only %d bytes in the ring", size, inRing)
				}
			})
		}
	}
}

// TestASettleWaitIsForTheChunksSentBeforeIt: a message's memory is given back once the peer read
// its own chunks, not the next message's sent meanwhile (the writer goes on lending while a
// message settles; an 8 MiB call queued behind a 48 MiB one waited for all of it).
func TestASettleWaitIsForTheChunksSentBeforeIt(t *testing.T) {
	client, server := lendingPair(t, true)
	send := func(id uint64) {
		t.Helper()
		if err := client.Send(&wire.Frame{Kind: wire.FrameChunk, ID: id, Payload: make([]byte, 256<<10)}); err != nil {
			t.Fatal(err)
		}
	}
	send(1)
	wait := client.Settled()
	send(2)
	if f, err := server.Recv(); err != nil || f.ID != 1 {
		t.Fatalf("read %v, %v; want chunk 1", f, err)
	}
	settled := make(chan error, 1)
	go func() { settled <- wait() }()
	select {
	case err := <-settled:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the wait for chunk 1 still waits 2 s after it was read: it waits for chunk 2, sent after it")
	}
	if _, err := server.Recv(); err != nil {
		t.Fatal(err)
	}
}

// TestLentMemoryIsHeldUntilSettled: after Send, the receiver reads the chunk from the sender's
// memory when it gets to it, so the settle wait waits for that, and a sender that changed the memory
// before then would change what arrives.
func TestLentMemoryIsHeldUntilSettled(t *testing.T) {
	client, server := lendingPair(t, true)
	data := bytes.Repeat([]byte{'a'}, 256<<10)
	if err := client.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: data}); err != nil {
		t.Fatal(err)
	}
	settled := make(chan error, 1)
	go func() { settled <- client.Settled()() }()
	select {
	case err := <-settled:
		t.Fatalf("the settle wait returned (%v) before the receiver read the chunk", err)
	case <-time.After(50 * time.Millisecond):
	}
	copy(data, "changed")
	got, err := server.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got.Payload, []byte("changed")) {
		t.Fatal("the chunk was copied when sent, not read from the sender's memory when received")
	}
	select {
	case err := <-settled:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the settle wait still waits 2 s after the receiver read the chunk")
	}
}

// TestARevokedLoanIsNotDelivered: once the sender revoked what it lent (its stream is ending and
// it may reuse the memory), the receiver does not deliver a chunk it read from that memory,
// even though the frame is whole in its ring; it ends the stream instead, as the peer's end.
func TestARevokedLoanIsNotDelivered(t *testing.T) {
	for _, c := range []struct {
		name   string
		revoke func(*stream)
	}{
		{"revoked", func(s *stream) { s.Revoke() }},
		{"closed", func(s *stream) { s.Close() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, server := lendingPair(t, true)
			if err := client.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: randomBytes(t, 2*minLentBytes)}); err != nil {
				t.Fatal(err)
			}
			c.revoke(client)
			f, err := server.Recv()
			if err == nil {
				t.Fatalf("a %d-byte chunk was delivered from memory its sender took back", len(f.Payload))
			}
			if errors.Is(err, transport.ErrMalformed) || !strings.Contains(err.Error(), "closed the stream") {
				t.Fatalf("Recv: %v; want the stream's end, saying the peer closed it", err)
			}
		})
	}
}

// TestLentBytesAreBoundedByTheWindow: a sender lends at most a window's worth of bytes the
// receiver has not read; otherwise a big message would be queued whole ahead of the next and
// the two could not take turns.
func TestLentBytesAreBoundedByTheWindow(t *testing.T) {
	client, server := lendingPair(t, true)
	out := &client.lanes[laneBulk].out
	chunk := int(lendingWindow(out.r.size)) / 2
	perWindow := 2
	data := randomBytes(t, 4*chunk)
	before := out.head
	sent := make(chan int, 4)
	go func() {
		for i := range 4 {
			if client.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: int64(i * chunk), Payload: data[i*chunk : (i+1)*chunk]}) != nil {
				break
			}
			sent <- i
		}
		close(sent)
	}()
	for want := range perWindow {
		if got := <-sent; got != want {
			t.Fatalf("chunk %d sent, want %d", got, want)
		}
	}
	select {
	case i := <-sent:
		t.Fatalf("chunk %d was lent while a window's worth was unread", i)
	case <-time.After(50 * time.Millisecond):
	}
	for i := range 4 {
		got, err := server.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Payload, data[i*chunk:(i+1)*chunk]) {
			t.Fatalf("chunk %d came out different", i)
		}
	}
	for i := range sent {
		if i < perWindow {
			t.Fatalf("chunk %d reported twice", i)
		}
	}
	if inRing := out.head - before; inRing > 4096 {
		t.Fatalf("the chunks were copied into the ring (%d bytes), not lent", inRing)
	}
}

// TestHostileLendingFramesAreRefused: a peer controls every word of a lending frame. Whatever
// it says (memory it was not allowed to lend, spans out of order or out of the frame, memory
// that is not there), the frame is refused as malformed, without a panic.
// lentChunkRing returns a bulk ring (in this process's memory) holding a frame that lends
// payload as a chunk.
func lentChunkRing(t *testing.T, payload []byte) ring {
	t.Helper()
	mem := fuzzRegion()
	rg := ringAt(mem, laneBulk, 0, MinRingBytes)
	w := &ringWriter{r: rg, wake: func(uint32) error { return nil }, broken: func() error { return nil }}
	var p wire.Parts
	pieces, total, err := p.Encode(&wire.Frame{Kind: wire.FrameChunk, ID: 9, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.writeLending(pieces, p.Referenced, total); err != nil {
		t.Fatal(err)
	}
	if w.lentTo.Load() == 0 {
		t.Fatal("the writer did not lend the chunk")
	}
	return rg
}

// lenderOf is process pid as a lender, or nil for pid 0.
func lenderOf(t testing.TB, pid int) *lender {
	t.Helper()
	if pid == 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := &lender{pid: pid, pidfd: fd}
	t.Cleanup(l.close)
	return l
}

// TestAGoneLenderCutsTheFrameShort: a peer that dies while its chunk is read from its memory
// ended the stream; it did not send a malformed frame (which would be logged as a protocol
// violation). Once it has exited, its pid may name another process: what was read then is
// not delivered even if the read worked. One that took its loan back may have freed the memory:
// the read fails, and that too is the stream's end.
func TestAGoneLenderCutsTheFrameShort(t *testing.T) {
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := lenderOf(t, child.Process.Pid)
	_ = child.Process.Kill()
	_ = child.Wait() // reaped: its pid is free for another process
	cases := []struct {
		name   string
		lender *lender
		freed  bool // the loan was revoked, then the lent address unmapped
		want   string
	}{
		{"its process is gone", exited, false, "process is gone"},
		{"its pid now names another process", &lender{pid: os.Getpid(), pidfd: exited.pidfd}, false, "process is gone"},
		{"it took the loan back and freed the memory", lenderOf(t, os.Getpid()), true, "closed the stream"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rg := lentChunkRing(t, randomBytes(t, 2*minLentBytes))
			if c.freed {
				rg.ctrl.revoked.Store(1)
				const addrAt = 16
				putUint32(rg.data[addrAt:], 4096)
				putUint32(rg.data[addrAt+4:], 0)
			}
			r := &ringReader{r: rg, lender: c.lender, sleep: func() error { return errNoMoreData }}
			f, err := r.readFrame(msgpack.NewDecoder(nil), nil)
			if err == nil {
				t.Fatalf("a %d-byte chunk was delivered from a process that had exited", len(f.Payload))
			}
			if errors.Is(err, transport.ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("readFrame: %v; want the stream's end saying %q, not a malformed frame", err, c.want)
			}
		})
	}
}

func TestHostileLendingFramesAreRefused(t *testing.T) {
	// Offsets in the ring of a frame lending one span: length word, span count, the span.
	const countAt, spanAt, spanLenAt, addrAt = 4, 8, 12, 16
	cases := []struct {
		name    string
		lender  int
		corrupt func(data []byte)
		want    string // in the error; "" for a frame that must decode
	}{
		{"well formed", os.Getpid(), func([]byte) {}, ""},
		{"lent to a stream that does not read lent memory", 0, func([]byte) {}, "does not read"},
		{"no spans", os.Getpid(), func(d []byte) { putUint32(d[countAt:], 0) }, "lends 0"},
		{"too many spans", os.Getpid(), func(d []byte) { putUint32(d[countAt:], maxLentSpans+1) }, "lends 9"},
		{"a span past the frame", os.Getpid(), func(d []byte) { putUint32(d[spanAt:], 1<<20) }, "ending at"},
		{"an empty span", os.Getpid(), func(d []byte) { putUint32(d[spanLenAt:], 0) }, "empty"},
		{"a span bigger than a frame may be", os.Getpid(), func(d []byte) { putUint32(d[spanLenAt:], wire.MaxFrameBytes+1) }, "empty"},
		{"memory that is not mapped", os.Getpid(), func(d []byte) { putUint32(d[addrAt:], 4096); putUint32(d[addrAt+4:], 0) }, "cannot be read"},
	}
	payload := randomBytes(t, 2*minLentBytes)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rg := lentChunkRing(t, payload)
			c.corrupt(rg.data)
			r := &ringReader{r: rg, lender: lenderOf(t, c.lender), sleep: func() error { return errNoMoreData }}
			f, err := r.readFrame(msgpack.NewDecoder(nil), nil)
			if c.want == "" {
				if err != nil || !bytes.Equal(f.Payload, payload) {
					t.Fatalf("readFrame: %v; want the chunk intact", err)
				}
				return
			}
			if !errors.Is(err, transport.ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("readFrame: %v; want a malformed frame (transport.ErrMalformed) saying %q", err, c.want)
			}
		})
	}
}

// TestLendingNeedsTheProbeReadBack: a reader agrees to read a writer's memory only if it reads
// back, at the address the writer announced in the process the socket names, the bytes it
// wrote into the region; otherwise chunks go through the ring.
func TestLendingNeedsTheProbeReadBack(t *testing.T) {
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	const dir = 0
	for _, tc := range []struct {
		name  string
		pid   int
		shift uint64 // added to the address the writer announces
		offer bool
		reads bool
	}{
		{"the process that mapped the region", os.Getpid(), 0, true, true},
		{"no process", 0, 0, true, false},
		{"a writer that announced nothing", os.Getpid(), 0, false, false},
		{"another process at the same address", other.Process.Pid, 0, true, false},
		{"an address where the region is not", os.Getpid(), 4096, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, mem, err := createRegion(MinRingBytes)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			defer unix.Munmap(mem)
			ctrl := ringAt(mem, laneBulk, dir, MinRingBytes).ctrl
			if tc.offer {
				offerLending(mem, MinRingBytes, dir)
				ctrl.lenderBase.Add(tc.shift)
			}
			got := acceptLending(mem, MinRingBytes, dir, tc.pid)
			defer got.close()
			if reads := got != nil; reads != tc.reads || (reads && got.pid != tc.pid) {
				t.Fatalf("acceptLending = %v, want reading %v", got, tc.reads)
			}
			if flag := ctrl.readsLender.Load() == 1; flag != tc.reads {
				t.Fatalf("readsLender %v, want %v", flag, tc.reads)
			}
		})
	}
}

// TestASharedReadCopiesEveryByteOnce: a long read is split between the reader and a helper;
// whatever the length (whole pieces or not), every byte lands where it belongs, and a read
// that cannot finish (memory not mapped partway) fails instead of waiting for a piece.
func TestASharedReadCopiesEveryByteOnce(t *testing.T) {
	src := randomBytes(t, 3*sharedReadMin+sharedReadPiece)
	for _, n := range []int{sharedReadMin - 1, sharedReadMin, sharedReadMin + 1, 2*sharedReadMin + 123} {
		// Reads that start on a piece boundary of the source and off one.
		for _, skew := range []int{-1, 0, 1, sharedReadPiece - 5} {
			t.Run(fmt.Sprintf("%d bytes, skew %d", n, skew), func(t *testing.T) {
				at := sharedReadPiece - int(uintptr(unsafe.Pointer(&src[0]))%sharedReadPiece) + skew
				want := src[at : at+n]
				dst := make([]byte, n+2)
				dst[0], dst[n+1] = 0xa5, 0x5a
				if err := readProcessShared(os.Getpid(), dst[1:n+1], uint64(uintptr(unsafe.Pointer(&want[0])))); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(dst[1:n+1], want) || dst[0] != 0xa5 || dst[n+1] != 0x5a {
					t.Fatal("the read came out different")
				}
			})
		}
	}
	t.Run("memory unreadable partway", func(t *testing.T) {
		mem, err := unix.Mmap(-1, 0, 4<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)
		if err := unix.Mprotect(mem[2<<20:], unix.PROT_NONE); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- readProcessShared(os.Getpid(), make([]byte, 4<<20), uint64(uintptr(unsafe.Pointer(&mem[0]))))
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("a read of unreadable memory worked")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the read did not end")
		}
	})
}

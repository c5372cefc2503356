package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/shmtransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestBigMessagesStartInQueueOrder: a big message that cannot start yet (it does not fit the
// interleave window beside one under way) is not passed by smaller ones queued after it, or a
// steady stream of those would starve it for ever.
func TestBigMessagesStartInQueueOrder(t *testing.T) {
	w := &frameWriter{}
	under := &outMessage{started: true, total: 10 << 20}
	big := &outMessage{total: interleaveWindow}
	small := &outMessage{total: 1 << 20}
	w.large = []*outMessage{big, under, small}
	w.underWay, w.underWayCount = under.total, 1
	if got := w.takeLarge(); got != under {
		t.Fatal("the message under way should be served while the big one waits")
	}
	w.large = append(w.large, under)
	if got := w.takeLarge(); got == small {
		t.Fatal("a smaller message started ahead of a big one queued before it")
	}
	w.finished(under)
	w.large = []*outMessage{big, small}
	if got := w.takeLarge(); got != big {
		t.Fatal("with nothing under way the big message should start first")
	}
}

// TestATurnIsAChunksLengthOfBytes: big messages take turns by bytes, not frames: a chunk cut
// short by the end of a segment (a message's small pickle before its array) keeps the turn,
// so that message does not wait a whole chunk of another message for each of its segments.
func TestATurnIsAChunksLengthOfBytes(t *testing.T) {
	s := &recordingStream{}
	w := newFrameWriter(s, 1<<10, func(error) {})
	defer w.close(ErrShutdown)
	w.sendMu.Lock() // both are queued before the writer picks the first frame
	a, errA := w.send(&wire.Frame{Kind: wire.FrameRequest, ID: 1}, Message{Payload: make([]byte, 4<<10)}, nil)
	b, errB := w.send(&wire.Frame{Kind: wire.FrameRequest, ID: 2}, Message{Payload: make([]byte, 100), Buffers: [][]byte{make([]byte, 2<<10)}}, nil)
	w.sendMu.Unlock()
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	for _, m := range []*outMessage{a, b} {
		select {
		case <-m.sent:
		case <-time.After(5 * time.Second):
			t.Fatal("a message was not sent")
		}
	}
	var got []string
	s.mu.Lock()
	for _, f := range s.sent {
		if f.Kind == wire.FrameChunk {
			got = append(got, fmt.Sprintf("%d:%d", f.ID, len(f.Payload)))
		}
	}
	s.mu.Unlock()
	want := []string{"1:1024", "2:100", "2:1024", "1:1024", "2:1024", "1:1024", "1:1024"}
	if !slices.Equal(got, want) {
		t.Fatalf("chunks went %v, want %v", got, want)
	}
}

// recordingStream keeps the frames sent on it.
type recordingStream struct {
	mu   sync.Mutex
	sent []*wire.Frame
}

func (s *recordingStream) Send(f *wire.Frame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, f)
	return nil
}
func (s *recordingStream) Recv() (*wire.Frame, error) { select {} }
func (s *recordingStream) Close() error               { return nil }

func (s *recordingStream) kinds() []wire.FrameKind {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []wire.FrameKind
	for _, f := range s.sent {
		out = append(out, f.Kind)
	}
	return out
}

// TestReferenceOperationsRideAhead: queued reference operations go with the next request (one
// frame, no wake-up of the owner's reader for them alone), and ahead of a big request in a frame
// of their own, since small frames may overtake a big message's header.
func TestReferenceOperationsRideAhead(t *testing.T) {
	op := wire.RefOp{Kind: wire.RefAdd, RRef: wire.RRefID{Creator: 1, Local: 7}, Fork: wire.ForkID{Creator: 1, Local: 8}, Holder: 1}
	cases := []struct {
		name      string
		size      int
		wantKinds []wire.FrameKind
		carrier   int // the frame that must carry the operation
	}{
		{"small request", 10, []wire.FrameKind{wire.FrameRequest}, 0},
		{"big request", 3 << 10, []wire.FrameKind{wire.FrameRefs, wire.FrameRequest, wire.FrameChunk, wire.FrameChunk}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &recordingStream{}
			queued := []wire.RefOp{op}
			w := newFrameWriter(s, 2<<10, func(error) {})
			w.takeRefOps = func(limit int) ([]wire.RefOp, uint64) {
				ops := queued[:min(limit, len(queued))]
				queued = queued[len(ops):]
				if len(ops) == 0 {
					return nil, 0
				}
				return ops, 1
			}
			defer w.close(ErrShutdown)
			out, err := w.send(&wire.Frame{Kind: wire.FrameRequest, ID: 1}, Message{Payload: make([]byte, c.size)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-out.sent:
			case <-time.After(5 * time.Second):
				t.Fatal("the request was not sent")
			}
			if got := s.kinds(); !slices.Equal(got, c.wantKinds) {
				t.Fatalf("frames sent: %v, want %v", got, c.wantKinds)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			for i, f := range s.sent {
				if want := i == c.carrier; (len(f.Refs) == 1 && f.Refs[0] == op && f.RefSeq == 1) != want || (!want && len(f.Refs) > 0) {
					t.Fatalf("frame %d (%v) carries %v; only frame %d should carry the operation", i, f.Kind, f.Refs, c.carrier)
				}
			}
			if err := w.sendRefOps(); err != nil || len(s.sent) != len(c.wantKinds) {
				t.Fatalf("with nothing queued, sendRefOps sent a frame (err %v)", err)
			}
		})
	}
}

// countingStream records the ids of the frames sent on it.
type countingStream struct {
	recordingStream
	ids []uint64
}

func (s *countingStream) Send(f *wire.Frame) error {
	if f.Kind != wire.FrameRequest || len(f.Sizes) > 0 {
		return nil // the big messages that keep the writer goroutine busy
	}
	s.mu.Lock()
	s.ids = append(s.ids, f.ID)
	s.mu.Unlock()
	runtime.Gosched() // widen the window between the writer goroutine's turns
	return nil
}

// TestSmallFramesKeepTheirOrder: frames sent one after another leave in that order, whether
// the caller sends one itself or the writer goroutine, busy with big messages, sends it from
// the queue.
func TestSmallFramesKeepTheirOrder(t *testing.T) {
	s := &countingStream{}
	w := newFrameWriter(s, 1<<10, func(error) {})
	defer w.close(ErrShutdown)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		big := Message{Payload: make([]byte, 64<<10)}
		for id := uint64(1 << 40); ; id++ {
			select {
			case <-stop:
				return
			default:
			}
			out, err := w.send(&wire.Frame{Kind: wire.FrameRequest, ID: id}, big, nil)
			if err != nil {
				return
			}
			<-out.sent
		}
	}()
	const n = 200_000
	var last *outMessage
	for i := range n {
		out, err := w.send(&wire.Frame{Kind: wire.FrameRequest, ID: uint64(i)}, Message{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		last = out
	}
	select {
	case <-last.sent:
	case <-time.After(30 * time.Second):
		t.Fatal("the frames were not all sent")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range s.ids {
		if id != uint64(i) {
			t.Fatalf("frame %d left as number %d: out of order", id, i)
		}
	}
}

// TestLentMessageMemoryIsKeptUntilThePeerReadIt: over shared memory a big message's chunks
// are lent (read by the receiver from the sender's memory when it gets to them), so the
// writer gives the memory back (onSent, after which a caller may reuse it) only once the
// receiver has read them, however late it reads.
func TestLentMessageMemoryIsKeptUntilThePeerReadIt(t *testing.T) {
	lt, err := shmtransport.New("", shmtransport.MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Close()
	dt, err := shmtransport.New("", shmtransport.MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer dt.Close()
	accepted := make(chan transport.Stream, 1)
	addr, err := lt.Listen("", func(s transport.Stream) { accepted <- s; select {} })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err := dt.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := client.(transport.Lending); !ok {
		t.Fatal("the shared-memory stream does not lend: the test would prove nothing")
	}
	w := newFrameWriter(client, 256<<10, func(error) {})
	defer w.close(ErrShutdown)
	if err := w.sendFrame(wire.HelloFrame("w0", 0, 0)); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	want := bytes.Clone(data)
	_, err = w.send(&wire.Frame{Kind: wire.FrameRequest, ID: 1}, Message{Payload: data}, func() { clear(data) })
	if err != nil {
		t.Fatal(err)
	}
	var server transport.Stream
	select {
	case server = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream was not served")
	}
	time.Sleep(100 * time.Millisecond) // a late reader; the outcome does not depend on it
	got := make([]byte, 0, len(data))
	for len(got) < len(data) {
		f, err := server.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == wire.FrameChunk {
			got = append(got, f.Payload...)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the message arrived changed: its memory was given back before the receiver read it")
	}
}

// settlingStream is a Lending stream that records, in order, what was sent and when the
// writer settled or revoked; its failAt-th Send (from 1; 0: none) fails, and it asks for
// chunks of chunkBytes (0: the writer's own).
type settlingStream struct {
	recordingStream
	events     []string
	failAt     int
	chunkBytes int
}

func (s *settlingStream) Send(f *wire.Frame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, fmt.Sprintf("send %d", f.Kind))
	if len(s.events) == s.failAt {
		s.events[len(s.events)-1] += " failed"
		return errors.New("the stream broke")
	}
	return nil
}

func (s *settlingStream) Revoke() { s.note("revoke") }

func (s *settlingStream) ChunkBytes() int { return s.chunkBytes }

func (s *settlingStream) Settled() func() error {
	return func() error {
		s.note("settle")
		return nil
	}
}

func (s *settlingStream) note(event string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, event)
}

// TestBigMessageIsGivenBackAfterSettling: whether a big message is sent whole or aborted
// partway, its memory is given back only after its last frame is sent and the stream settled;
// a small one's at once. One that the stream fails partway is given back after the loans are
// revoked (the peer may still be reading its chunks).
func TestBigMessageIsGivenBackAfterSettling(t *testing.T) {
	chunk, header, abort := fmt.Sprintf("send %d", wire.FrameChunk), fmt.Sprintf("send %d", wire.FrameRequest), fmt.Sprintf("send %d", wire.FrameAbort)
	cases := []struct {
		name   string
		size   int
		abort  bool
		failAt int
		// chunkBytes is the stream's chunk length (0: the writer's, 1 KiB)
		chunkBytes int
		want       []string
	}{
		{"small", 100, false, 0, 0, []string{header, "given back"}},
		{"big", 2 << 10, false, 0, 0, []string{header, chunk, chunk, "settle", "given back"}},
		{"big, in chunks of the stream's length", 8 << 10, false, 0, 4 << 10, []string{header, chunk, chunk, "settle", "given back"}},
		{"big, aborted", 64 << 10, true, 0, 0, []string{header, chunk, abort, "settle", "given back"}},
		{"big, the stream fails partway", 4 << 10, false, 3, 0, []string{header, chunk, chunk + " failed", "revoke", "given back"}},
		{"big, the stream fails on its last chunk", 2 << 10, false, 3, 0, []string{header, chunk, chunk + " failed", "revoke", "given back"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &settlingStream{failAt: c.failAt, chunkBytes: c.chunkBytes}
			w := newFrameWriter(s, 1<<10, func(error) {})
			defer w.close(ErrShutdown)
			var out *outMessage
			var err error
			onSent := func() { s.note("given back") }
			if c.abort {
				// As if the header and a chunk were sent, then abort; the writer (which takes
				// sendMu before it looks at the queue) waits meanwhile.
				w.sendMu.Lock()
				out, err = w.send(&wire.Frame{Kind: wire.FrameRequest, ID: 1}, Message{Payload: make([]byte, c.size)}, onSent)
				w.mu.Lock()
				out.started, out.offset, out.aborted = true, 1<<10, true
				w.underWay, w.underWayCount = out.total, 1
				s.note(header)
				s.note(chunk)
				w.mu.Unlock()
				w.sendMu.Unlock()
				w.kick()
			} else {
				out, err = w.send(&wire.Frame{Kind: wire.FrameRequest, ID: 1}, Message{Payload: make([]byte, c.size)}, onSent)
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-out.sent:
			case <-time.After(5 * time.Second):
				t.Fatal("the message was not given back")
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				s.mu.Lock()
				got := slices.Clone(s.events)
				s.mu.Unlock()
				if slices.Equal(got, c.want) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("events %v, want %v", got, c.want)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}

// holdingStream is a Lending stream whose peer holds what was lent until the stream is
// closed (a frozen peer), unless reads is set (a peer that runs: the settle wait returns at once).
type holdingStream struct {
	recordingStream
	reads     bool
	closeOnce sync.Once
	closed    chan struct{}
}

func (s *holdingStream) Settled() func() error {
	return func() error {
		if s.reads {
			return nil
		}
		<-s.closed
		return errors.New("the stream ended")
	}
}
func (s *holdingStream) Revoke()         {}
func (s *holdingStream) ChunkBytes() int { return 0 }
func (s *holdingStream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

// TestAPeerHoldingAnAbandonedMessageLosesItsStream: once a big message's call gave up, a peer
// that still holds its memory after abandonGrace (a frozen one, which never reads what was lent)
// has its stream ended, and the memory comes back; one that reads in time keeps its stream.
func TestAPeerHoldingAnAbandonedMessageLosesItsStream(t *testing.T) {
	defer func(d time.Duration) { abandonGrace = d }(abandonGrace)
	abandonGrace = 50 * time.Millisecond
	for _, reads := range []bool{false, true} {
		t.Run(fmt.Sprintf("the peer reads: %v", reads), func(t *testing.T) {
			s := &holdingStream{reads: reads, closed: make(chan struct{})}
			failed := make(chan error, 1)
			// As a peer connection does: its failure closes the stream.
			w := newFrameWriter(s, 1<<10, func(err error) { failed <- err; s.Close() })
			defer w.close(ErrShutdown)
			out, err := w.send(&wire.Frame{Kind: wire.FrameRequest, ID: 1}, Message{Payload: make([]byte, 4<<10)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(s.kinds()) < 5 { // the header and four chunks: all lent
				if time.Now().After(deadline) {
					t.Fatalf("sent only %v", s.kinds())
				}
				time.Sleep(time.Millisecond)
			}
			w.abort(out) // the call gave up
			select {
			case err := <-failed:
				if reads {
					t.Fatalf("a peer that read what was lent lost its stream: %v", err)
				}
				if !strings.Contains(err.Error(), "after the message's call gave up") {
					t.Fatalf("the stream ended with %q", err)
				}
			case <-time.After(10 * abandonGrace):
				if !reads {
					t.Fatal("the stream of a peer holding an abandoned message's memory did not end")
				}
			}
			select {
			case <-out.sent:
			case <-time.After(5 * time.Second):
				t.Fatal("the message's memory did not come back")
			}
		})
	}
}

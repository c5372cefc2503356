package grpctransport

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// noticing is a lane that tells when a frame it reads matches.
type noticing struct {
	msgStream
	match   func(*wire.Frame) bool
	arrived chan struct{}
	once    sync.Once
}

func (n *noticing) RecvMsg(m any) error {
	err := n.msgStream.RecvMsg(m)
	if f, ok := m.(*wire.Frame); ok && err == nil && n.match(f) {
		n.once.Do(func() { close(n.arrived) })
	}
	return err
}

// TestSmallFrameOvertakesABigTransfer: while a big message fills the flow-control window
// toward a reader that is not reading, a small frame is still sent at once and is read within
// a few frames; the frames of each lane keep their order.
func TestSmallFrameOvertakesABigTransfer(t *testing.T) {
	const chunks = 40
	server, err := New("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	start := make(chan struct{})
	smallAt := make(chan int, 1) // how many bulk frames were read before the small one
	handlerDone := make(chan struct{})
	// smallArrived is closed once the server's small lane has read the small frame: it waits
	// to be handed over.
	smallArrived := make(chan struct{})
	addr, err := server.Listen("127.0.0.1", func(s transport.Stream) {
		defer close(handlerDone)
		ls, ok := s.(*lanedServerStream)
		if !ok {
			t.Errorf("the accepted stream is a %T, not two lanes", s)
			return
		}
		ls.small = &noticing{msgStream: ls.small, arrived: smallArrived, match: func(f *wire.Frame) bool { return f.ID == 2 }}
		if hello, err := s.Recv(); err != nil || hello.Kind != wire.FrameHello {
			t.Errorf("first frame: %v (err %v), want the hello", hello, err)
			return
		}
		<-start // not reading: the big message fills the window meanwhile
		for bulk := 0; ; {
			f, err := s.Recv()
			if err != nil {
				return // the client closed the stream: the test is over
			}
			if !transport.Bulk(f) {
				smallAt <- bulk
				continue
			}
			if f.Kind == wire.FrameChunk && f.Offset != int64(bulk-1)<<20 {
				t.Errorf("bulk frame %d has offset %d: out of order", bulk, f.Offset)
			}
			bulk++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	client, err := New("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.Close()
		<-handlerDone
	}()
	if err := s.Send(wire.HelloFrame("w0", 0, 0)); err != nil {
		t.Fatal(err)
	}
	var bulkSent atomic.Int64 // chunks handed to the bulk lane
	go func() {
		s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "m", Sizes: []int64{chunks << 20}})
		chunk := make([]byte, 1<<20)
		for i := range chunks {
			if err := s.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: int64(i) << 20, Payload: chunk}); err != nil {
				return
			}
			bulkSent.Add(1)
		}
	}()
	// The big message's chunks fill the flow-control window (4 MiB, secure's grpcWindow)
	// ahead of the small frame: on one lane, the small frame would wait for the reader.
	for bulkSent.Load() < 4 {
		if ctx.Err() != nil {
			close(start)
			t.Fatalf("only %d chunks were sent toward a window of 4 MiB", bulkSent.Load())
		}
		time.Sleep(time.Millisecond)
	}
	sent := make(chan error, 1)
	go func() {
		sent <- s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 2, Method: "m", Payload: []byte("small")})
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(start)
		t.Fatal("a small frame waited for the big message's flow-control window")
	}
	select { // the small frame reached the server before it reads
	case <-smallArrived:
	case <-ctx.Done():
		close(start)
		t.Fatal("the small frame did not reach the server")
	}
	close(start)
	select {
	case n := <-smallAt:
		// With one lane it would come after every frame queued ahead of it (a window's worth).
		if n > 8 {
			t.Fatalf("the small frame was read after %d bulk frames, want a few at most", n)
		}
	case <-ctx.Done():
		t.Fatal("the small frame did not arrive")
	}
}

// queuedLane is a lane that gives the frames queued on it, then waits until done.
type queuedLane struct {
	frames chan *wire.Frame
	done   chan struct{}
}

func (q *queuedLane) SendMsg(any) error { return nil }

func (q *queuedLane) RecvMsg(m any) error {
	select {
	case f := <-q.frames:
		*m.(*wire.Frame) = *f
		return nil
	case <-q.done:
		return transport.ErrClosed
	}
}

// TestAFrameOnTheWrongLaneEndsTheStream: a peer that sends a big message's frame on the small
// lane, or a small frame on the bulk lane, has the stream fail as malformed, rather than
// have two readers decode into one message.
func TestAFrameOnTheWrongLaneEndsTheStream(t *testing.T) {
	cases := []struct {
		name string
		bulk bool
		f    *wire.Frame
	}{
		{"a chunk on the small lane", false, &wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: []byte("x")}},
		{"a big request's header on the small lane", false, &wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "m", Sizes: []int64{1 << 20}}},
		{"a small request on the bulk lane", true, &wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "m"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan struct{})
			defer close(done)
			small := &queuedLane{frames: make(chan *wire.Frame, 1), done: done}
			bulk := &queuedLane{frames: make(chan *wire.Frame, 1), done: done}
			s := newLaned(small, bulk, false)
			if c.bulk {
				bulk.frames <- c.f
			} else {
				small.frames <- c.f
			}
			f, err := s.Recv()
			if !errors.Is(err, transport.ErrMalformed) {
				t.Fatalf("Recv gave %v, %v; want the stream to fail as malformed", f, err)
			}
		})
	}
}

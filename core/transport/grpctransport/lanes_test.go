package grpctransport

import (
	"context"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

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
	addr, err := server.Listen("127.0.0.1", func(s transport.Stream) {
		defer close(handlerDone)
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
	go func() {
		s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "m", Sizes: []int64{chunks << 20}})
		chunk := make([]byte, 1<<20)
		for i := range chunks {
			if err := s.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: int64(i) << 20, Payload: chunk}); err != nil {
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond) // let the big message fill the window; the outcome does not depend on it
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
	time.Sleep(100 * time.Millisecond) // let the small frame reach the server before it reads
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

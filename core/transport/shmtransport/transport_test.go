package shmtransport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// pair opens one stream between two transports and returns both ends.
func pair(t *testing.T, dialToken, listenToken string, ringBytes int) (client, server transport.Stream, err error) {
	t.Helper()
	lt, err := New(listenToken, ringBytes)
	if err != nil {
		t.Fatal(err)
	}
	dt, err := New(dialToken, ringBytes)
	if err != nil {
		t.Fatal(err)
	}
	return connect(t, dt, lt)
}

// connect opens one stream from dt to lt and returns both ends; it closes both transports
// when the test ends.
func connect(t *testing.T, dt, lt *Transport) (client, server transport.Stream, err error) {
	t.Helper()
	t.Cleanup(func() { dt.Close(); lt.Close() })
	accepted := make(chan transport.Stream, 1)
	addr, err := lt.Listen("", func(s transport.Stream) {
		accepted <- s
		<-s.(*stream).done
	})
	if err != nil {
		t.Fatal(err)
	}
	if !dt.Reaches(addr) {
		t.Fatalf("a transport on this host does not reach %s", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err = dt.Dial(ctx, addr)
	if err != nil {
		return nil, nil, err
	}
	select {
	case server = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the listener never served the stream")
	}
	return client, server, nil
}

func TestFramesCrossBothWays(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), (3*MinRingBytes+7)/16) // wraps the ring several times
	frames := []*wire.Frame{
		{Kind: wire.FrameRequest, ID: 1, Method: "echo", Payload: []byte("small")},
		{Kind: wire.FrameRequest, ID: 2, Payload: big, Buffers: [][]byte{big[:5000], {}, big}},
		{Kind: wire.FrameResponse, ID: 3, Error: "e", Sizes: []int64{1, 2, 3}},
	}
	for _, dir := range []struct {
		name     string
		from, to transport.Stream
	}{{"dialer to listener", client, server}, {"listener to dialer", server, client}} {
		t.Run(dir.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				for _, f := range frames {
					if err := dir.from.Send(f); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for _, want := range frames {
				got, err := dir.to.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if got.ID != want.ID || got.Method != want.Method || got.Error != want.Error ||
					!bytes.Equal(got.Payload, want.Payload) || len(got.Buffers) != len(want.Buffers) || len(got.Sizes) != len(want.Sizes) {
					t.Fatalf("frame %d came out different", want.ID)
				}
				for i := range want.Buffers {
					if !bytes.Equal(got.Buffers[i], want.Buffers[i]) {
						t.Fatalf("frame %d buffer %d came out different", want.ID, i)
					}
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The first frame of an accepted stream is the dialer's hello, on the small lane: a big
// message's frame, on the bulk lane, may not overtake it even when it is there first (as it
// is when the listener looks at the small lane a moment before the dialer writes both).
func TestAcceptedStreamReadsItsFirstFrameFromTheSmallLane(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	header := &wire.Frame{Kind: wire.FrameRequest, ID: 7, Sizes: []int64{1 << 20}}
	if !transport.Bulk(header) {
		t.Fatal("the test needs a frame of the bulk lane")
	}
	if err := client.Send(header); err != nil {
		t.Fatal(err)
	}
	got := make(chan *wire.Frame, 2)
	go func() {
		for range 2 {
			f, err := server.Recv()
			if err != nil {
				close(got)
				return
			}
			got <- f
		}
	}()
	select {
	case f := <-got:
		t.Fatalf("the listener read frame %d (kind %d) before any hello", f.ID, f.Kind)
	case <-time.After(50 * time.Millisecond):
	}
	if err := client.Send(wire.HelloFrame("w0", 0, 0)); err != nil {
		t.Fatal(err)
	}
	for i, want := range []wire.FrameKind{wire.FrameHello, wire.FrameRequest} {
		select {
		case f, ok := <-got:
			if !ok {
				t.Fatalf("frame %d: the stream ended", i)
			}
			if f.Kind != want {
				t.Fatalf("frame %d is of kind %d, want %d", i, f.Kind, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("frame %d never came", i)
		}
	}
}

func TestWrongTokenIsRefusedBeforeAnyRegion(t *testing.T) {
	_, _, err := pair(t, "wrong", "right", 0)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("dial with the wrong token: %v, want a refusal", err)
	}
}

func TestClosedPeerFailsBlockedCalls(t *testing.T) {
	cases := []struct {
		name string
		// block starts a call that cannot finish while the peer lives.
		block func(s transport.Stream) error
	}{
		{"a receive waiting for data", func(s transport.Stream) error { _, err := s.Recv(); return err }},
		{"a send waiting for room", func(s transport.Stream) error {
			for range 100 { // the ring fills within a few frames
				if err := s.Send(&wire.Frame{Kind: wire.FrameRequest, Payload: make([]byte, MinRingBytes/2)}); err != nil {
					return err
				}
			}
			return errors.New("100 frames fit a ring nobody reads")
		}},
		{"a settle waiting for the peer to read a lent chunk", func(s transport.Stream) error {
			if err := s.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: make([]byte, 4*minLentBytes)}); err != nil {
				return err
			}
			if s.(*stream).lanes[laneBulk].out.lentTo.Load() == 0 {
				return errors.New("the chunk was not lent")
			}
			return s.(transport.Lending).Settled()()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client, server, err := pair(t, "", "", MinRingBytes)
			if err != nil {
				t.Fatal(err)
			}
			failed := make(chan error, 1)
			go func() { failed <- c.block(client) }()
			time.Sleep(50 * time.Millisecond) // let it block; the outcome does not depend on it
			server.Close()
			select {
			case err := <-failed:
				if err == nil || !strings.Contains(err.Error(), "gone") {
					t.Fatalf("got %v, want an error saying the peer is gone", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("the call still waits 2 s after its peer closed")
			}
		})
	}
}

func TestHostileIndicesAreRefused(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(ctrl *ringCtrl)
	}{
		{"write index far ahead", func(c *ringCtrl) { c.head.Store(1 << 40) }},
		{"write index behind", func(c *ringCtrl) { c.head.Store(^uint64(0)) }},
	}
	for _, c := range cases {
		for _, ln := range []int{laneSmall, laneBulk} {
			t.Run(fmt.Sprintf("%s, lane %d", c.name, ln), func(t *testing.T) {
				client, server, err := pair(t, "", "", MinRingBytes)
				if err != nil {
					t.Fatal(err)
				}
				// The client's outgoing ring is the server's incoming one, in the same memory.
				c.corrupt(client.(*stream).lanes[ln].out.r.ctrl)
				client.(*stream).wakePeer(readerOnSocket)
				if _, err := server.Recv(); !errors.Is(err, errCorrupt) || !errors.Is(err, transport.ErrMalformed) {
					t.Fatalf("Recv: %v, want %v, reported as the peer's fault (transport.ErrMalformed)", err, errCorrupt)
				}
			})
		}
	}
}

// openBulkLane sends and receives the dialer's opening frame: the bulk lane of an accepted
// stream is read only after it.
func openBulkLane(t *testing.T, dialed, accepted transport.Stream) {
	t.Helper()
	if err := dialed.Send(wire.HelloFrame("w0", 0, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := accepted.Recv(); err != nil {
		t.Fatal(err)
	}
}

func TestOversizedFrameLengthIsRefused(t *testing.T) {
	for _, ln := range []int{laneSmall, laneBulk} {
		t.Run(fmt.Sprintf("lane %d", ln), func(t *testing.T) {
			client, server, err := pair(t, "", "", MinRingBytes)
			if err != nil {
				t.Fatal(err)
			}
			openBulkLane(t, client, server)
			var prefix [4]byte
			putUint32(prefix[:], wire.MaxFrameBytes+1)
			w := &client.(*stream).lanes[ln].out
			if err := w.put(prefix[:]); err != nil {
				t.Fatal(err)
			}
			w.publish()
			if _, err := server.Recv(); !errors.Is(err, transport.ErrMalformed) || !strings.Contains(err.Error(), "more than") {
				t.Fatalf("Recv: %v, want a refusal of the length, as the peer's fault (transport.ErrMalformed)", err)
			}
		})
	}
}

// TestSmallFrameOvertakesAFullBulkLane: with the bulk lane full and its producer waiting for
// room, a small frame is still sent at once and read first.
func TestSmallFrameOvertakesAFullBulkLane(t *testing.T) {
	client, server, err := pair(t, "", "", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	bulkSent := make(chan error, 1)
	go func() {
		for i := range 3 { // 90 KiB for a 64 KiB ring nobody reads yet: the third waits
			f := &wire.Frame{Kind: wire.FrameRequest, ID: uint64(i + 1), Sizes: []int64{30 << 10}, Payload: make([]byte, 30<<10)}
			if err := client.Send(f); err != nil {
				bulkSent <- err
				return
			}
		}
		bulkSent <- nil
	}()
	time.Sleep(50 * time.Millisecond) // let the bulk producer block; the outcome does not depend on it
	smallSent := make(chan error, 1)
	go func() {
		smallSent <- client.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 99, Payload: []byte("small")})
	}()
	select {
	case err := <-smallSent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a small frame waited for room in the bulk lane")
	}
	f, err := server.Recv()
	if err != nil || f.ID != 99 {
		t.Fatalf("first frame read: %v (err %v), want the small one (id 99)", f, err)
	}
	for want := uint64(1); want <= 3; want++ {
		if f, err := server.Recv(); err != nil || f.ID != want {
			t.Fatalf("bulk frame: %v (err %v), want id %d", f, err, want)
		}
	}
	if err := <-bulkSent; err != nil {
		t.Fatal(err)
	}
}

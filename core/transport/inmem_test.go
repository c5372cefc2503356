package transport

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// inmemPair returns a dialed stream and the stream its listener accepted, on net.
func inmemPair(t *testing.T, net *InmemNetwork) (dialer, listener *InmemTransport, dialed Stream, accepted Stream) {
	t.Helper()
	dialer, listener = net.Transport(), net.Transport()
	if _, err := dialer.Listen("", func(Stream) {}); err != nil {
		t.Fatal(err)
	}
	got := make(chan Stream, 1)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	addr, err := listener.Listen("", func(s Stream) { got <- s; <-done })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dialed, err = dialer.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case accepted = <-got:
	case <-ctx.Done():
		t.Fatal("the listener never got the stream")
	}
	return dialer, listener, dialed, accepted
}

func small(id uint64) *wire.Frame { return &wire.Frame{Kind: wire.FrameRequest, ID: id} }
func bulk(id uint64) *wire.Frame  { return &wire.Frame{Kind: wire.FrameChunk, ID: id} }

// recvIDs receives n frames and returns their ids, failing the test if they do not come
// within 5 s.
func recvIDs(t *testing.T, s Stream, n int) []uint64 {
	t.Helper()
	ids := make(chan []uint64, 1)
	go func() {
		var got []uint64
		for range n {
			f, err := s.Recv()
			if err != nil {
				break
			}
			got = append(got, f.ID)
		}
		ids <- got
	}()
	select {
	case got := <-ids:
		return got
	case <-time.After(5 * time.Second):
		s.Close()
		t.Fatalf("%d frames did not arrive within 5 s", n)
		return nil
	}
}

func TestInmemFaults(t *testing.T) {
	isRequest := func(f *wire.Frame) bool { return f.Kind == wire.FrameRequest }
	tests := []struct {
		name  string
		fault func(from, to string, release <-chan struct{}) Fault
		send  []*wire.Frame
		// before is received before the test closes release; after, once it has.
		before, after []uint64
	}{
		{
			name: "a held frame lets the other lane by and holds its own lane behind it",
			fault: func(from, to string, release <-chan struct{}) Fault {
				return Fault{From: from, To: to, Match: Bulk, Hold: release}
			},
			send:   []*wire.Frame{bulk(1), bulk(2), small(3), small(4)},
			before: []uint64{3, 4},
			after:  []uint64{1, 2},
		},
		{
			name: "a delayed frame keeps its place in its lane",
			fault: func(from, to string, _ <-chan struct{}) Fault {
				return Fault{From: from, To: to, Match: func(f *wire.Frame) bool { return f.ID == 1 }, Delay: 30 * time.Millisecond}
			},
			send:   []*wire.Frame{small(1), small(2), bulk(3)},
			before: []uint64{3, 1, 2},
		},
		{
			name: "dropped frames are lost and the stream carries the rest",
			fault: func(from, to string, _ <-chan struct{}) Fault {
				return Fault{From: from, To: to, Match: isRequest, Drop: true}
			},
			send:   []*wire.Frame{small(1), bulk(2), small(3), {Kind: wire.FrameResponse, ID: 4}},
			before: []uint64{4, 2},
		},
		{
			name:   "a fault on the other direction leaves this one alone",
			fault:  func(from, to string, _ <-chan struct{}) Fault { return Fault{From: to, To: from, Drop: true} },
			send:   []*wire.Frame{small(1), small(2)},
			before: []uint64{1, 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			net := NewInmemNetwork()
			dialer, listener, dialed, accepted := inmemPair(t, net)
			// The stream's first frame goes before the fault, so its first-frame rule is out of
			// the way.
			if err := dialed.Send(small(0)); err != nil {
				t.Fatal(err)
			}
			if got := recvIDs(t, accepted, 1); fmt.Sprint(got) != "[0]" {
				t.Fatalf("first frame: got %v", got)
			}
			release := make(chan struct{})
			fault := net.Inject(tt.fault(dialer.addr, listener.addr, release))
			for _, f := range tt.send {
				if err := dialed.Send(f); err != nil {
					t.Fatal(err)
				}
			}
			if got := recvIDs(t, accepted, len(tt.before)); fmt.Sprint(got) != fmt.Sprint(tt.before) {
				t.Fatalf("received %v, want %v", got, tt.before)
			}
			close(release)
			if got := recvIDs(t, accepted, len(tt.after)); fmt.Sprint(got) != fmt.Sprint(tt.after) {
				t.Fatalf("after the release: received %v, want %v", got, tt.after)
			}
			fault.Remove()
			if err := dialed.Send(small(99)); err != nil {
				t.Fatal(err)
			}
			if got := recvIDs(t, accepted, 1); fmt.Sprint(got) != "[99]" {
				t.Fatalf("after the fault was removed: received %v, want [99]", got)
			}
		})
	}
}

// TestInmemFirstFrameIsReceivedFirst: an accepted stream's first frame, held on the network,
// is still the first received; the big message's frame sent after it waits (see Laned).
func TestInmemFirstFrameIsReceivedFirst(t *testing.T) {
	net := NewInmemNetwork()
	dialer, listener := net.Transport(), net.Transport()
	if _, err := dialer.Listen("", func(Stream) {}); err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	first := make(chan uint64, 2)
	addr, err := listener.Listen("", func(s Stream) {
		<-start // both frames are queued, the hello held
		for range 2 {
			f, err := s.Recv()
			if err != nil {
				return
			}
			first <- f.ID
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	net.Inject(Fault{Match: func(f *wire.Frame) bool { return f.Kind == wire.FrameHello }, Hold: release})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := dialer.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, f := range []*wire.Frame{{Kind: wire.FrameHello, ID: 1}, bulk(2)} {
		if err := s.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	close(start)
	// Without the rule the bulk frame is received at once; with it nothing is, until the
	// hello is released.
	select {
	case id := <-first:
		t.Fatalf("frame %d was received while the stream's first frame was held", id)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	got := []uint64{<-first, <-first}
	if fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("received %v, want the hello first: [1 2]", got)
	}
}

func TestInmemPartition(t *testing.T) {
	net := NewInmemNetwork()
	a, b, dialed, accepted := inmemPair(t, net)
	c := net.Transport()
	cAddr, err := c.Listen("", func(Stream) {})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	net.Partition(a.addr, b.addr)
	for name, s := range map[string]Stream{"dialed": dialed, "accepted": accepted} {
		if _, err := s.Recv(); !errors.Is(err, ErrClosed) {
			t.Fatalf("%s stream across the cut: Recv gave %v, want ErrClosed", name, err)
		}
	}
	for _, from := range []*InmemTransport{a, b} {
		to := map[*InmemTransport]string{a: b.addr, b: a.addr}[from]
		if _, err := from.Dial(ctx, to); !errors.Is(err, ErrUnreachable) {
			t.Fatalf("dial across the cut: %v, want ErrUnreachable", err)
		}
		if err := from.Probe(ctx, to); !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrGone) {
			t.Fatalf("probe across the cut: %v, want ErrUnreachable and not ErrGone", err)
		}
	}
	other, err := a.Dial(ctx, cAddr)
	if err != nil {
		t.Fatalf("a link not cut: %v", err)
	}
	other.Close()

	net.Heal(a.addr, b.addr)
	healed, err := a.Dial(ctx, b.addr)
	if err != nil {
		t.Fatalf("dial after Heal: %v", err)
	}
	healed.Close()

	c.Close()
	if err := a.Probe(ctx, cAddr); !errors.Is(err, ErrGone) {
		t.Fatalf("probe of a closed transport: %v, want ErrGone", err)
	}
}

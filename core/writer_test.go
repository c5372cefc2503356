package core

import (
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

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

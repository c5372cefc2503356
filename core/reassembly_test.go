package core

import (
	"context"
	"errors"
	"github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestReassemblyChecksWhatPeersAnnounce: every size, offset and length a peer announces is
// checked without overflow; what breaks the protocol ends the stream, and what is merely over
// a limit is refused (its chunks dropped) without reserving or allocating anything.
func TestReassemblyChecksWhatPeersAnnounce(t *testing.T) {
	const limit, budget = 1 << 20, 2 << 20
	tests := []struct {
		name        string
		frames      []*wire.Frame
		wantRefused string // in the refusal of the last frame's message
		wantErr     error
	}{
		{name: "sizes whose sum wraps past int64", wantRefused: "limit", frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{1, math.MaxInt64, math.MaxInt64, 2}}}},
		{name: "a chunk of a wrapped message", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{1, math.MaxInt64, math.MaxInt64, 2}},
			{Kind: wire.FrameChunk, ID: 1, Offset: math.MaxInt64 - 1, Payload: []byte{1, 2}}}},
		{name: "an offset near the end of int64", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{64}},
			{Kind: wire.FrameChunk, ID: 1, Offset: math.MaxInt64 - 2, Payload: []byte{1, 2, 3, 4}}}},
		{name: "a negative offset", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{64}},
			{Kind: wire.FrameChunk, ID: 1, Offset: -8, Payload: []byte{1}}}},
		{name: "more bytes than announced", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{4}},
			{Kind: wire.FrameChunk, ID: 1, Offset: 0, Payload: []byte{1, 2}},
			{Kind: wire.FrameChunk, ID: 1, Offset: 2, Payload: []byte{1, 2, 3}}}},
		// Overlapping chunks would leave part of a pooled buffer, an earlier message's bytes,
		// unwritten.
		{name: "a chunk sent twice", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{4}},
			{Kind: wire.FrameChunk, ID: 1, Offset: 0, Payload: []byte{1, 2}},
			{Kind: wire.FrameChunk, ID: 1, Offset: 0, Payload: []byte{1, 2}}}},
		{name: "a negative size", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{8, -4}}}},
		{name: "over the message limit", wantRefused: "1048576-byte limit", frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{limit, 1}}}},
		{name: "a second message past the interleave window", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{16}},
			{Kind: wire.FrameRequest, ID: 2, Sizes: []int64{interleaveWindow}}}},
		{name: "the same id twice", wantErr: errProtocol, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{16}},
			{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{16}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newReceiveBudget(budget, slog.Default())
			r := newReassembler(testctx.For(t), limit, b, "peer")
			var refused, err error
			for _, f := range tt.frames {
				if _, _, refused, err = r.add(f); err != nil {
					break
				}
			}
			switch {
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			case tt.wantErr == nil && err != nil:
				t.Fatalf("err = %v", err)
			case tt.wantRefused != "" && (!errors.Is(refused, ErrTooLarge) || !strings.Contains(refused.Error(), tt.wantRefused)):
				t.Fatalf("refused = %v, want ErrTooLarge naming %q", refused, tt.wantRefused)
			}
			if tt.wantRefused != "" && b.inUse() != 0 {
				t.Fatalf("a refused message reserved %d bytes", b.inUse())
			}
			r.close()
			if b.inUse() != 0 {
				t.Fatalf("%d bytes still reserved after close", b.inUse())
			}
		})
	}
}

// TestDestChecksOffsetsWithoutOverflow: the decoder asks where a chunk goes before reading it;
// offsets and lengths that overflow must not slice.
func TestDestChecksOffsetsWithoutOverflow(t *testing.T) {
	r := newReassembler(testctx.For(t), 1<<20, newReceiveBudget(1<<20, slog.Default()), "peer")
	if _, _, _, err := r.add(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{100}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		offset int64
		n      int
	}{{math.MaxInt64 - 10, 20}, {math.MaxInt64, 1}, {-1, 1}, {90, 11}, {101, 0}, {0, -1}} {
		if dst, ok := r.dest(1, c.offset, c.n); ok {
			t.Errorf("dest(%d, %d) = %d bytes, want a refusal", c.offset, c.n, len(dst))
		}
	}
	if dst, ok := r.dest(1, 0, 10); !ok || len(dst) != 10 {
		t.Errorf("dest(0, 10) = %d bytes, %v; want the first 10 bytes", len(dst), ok)
	}
}

// TestReleaseTwiceReturnsMemoryOnce: a message released twice must not put its buffer in the
// pool twice, or two later messages would share it.
func TestReleaseTwiceReturnsMemoryOnce(t *testing.T) {
	const size = 3 << 20 // a size class no other test of this package uses
	r := newReassembler(testctx.For(t), 1<<30, newReceiveBudget(1<<30, slog.Default()), "peer")
	r.add(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{size}})
	_, msg, _, err := r.add(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: make([]byte, size)})
	if err != nil || !msg.Pooled() {
		t.Fatalf("no pooled message: %v", err)
	}
	msg.Release()
	msg.Release()
	a, b := bufpool.Shared.Get(size), bufpool.Shared.Get(size)
	if &a[0] == &b[0] {
		t.Fatal("two buffers from the pool share memory after a double release")
	}
}

// TestReceiveBudgetWaitsForRoom: a reservation that does not fit waits until memory is
// returned, or until its context ends; one bigger than the whole budget fails at once.
func TestReceiveBudgetWaitsForRoom(t *testing.T) {
	b := newReceiveBudget(100, slog.Default())
	first := &reservation{n: 80, peer: "first"}
	if err := b.reserve(testctx.For(t), first); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.reserve(testctx.For(t), &reservation{n: 50, peer: "second"}) }()
	select {
	case err := <-got:
		t.Fatalf("a reservation over the budget did not wait: %v", err)
	case <-time.After(50 * time.Millisecond): // a negative check: it must still be waiting
	}
	b.free(first)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reservation was not woken when memory came back")
	}
	ctx, cancel := context.WithCancel(testctx.For(t))
	go func() { got <- b.reserve(ctx, &reservation{n: 60, peer: "third"}) }()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the wait to end with its context", err)
	}
	if err := b.reserve(testctx.For(t), &reservation{n: 101, peer: "huge"}); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "whole 100-byte receive budget") {
		t.Fatalf("err = %v, want ErrTooLarge naming the budget", err)
	}
}

// TestStalledStreamsLoseTheirMemory: a stream that holds budget (and memory: it sent a first
// chunk) and then says nothing while another waits loses its messages' memory, really freed,
// and is dropped at its next frame; so a peer that announces big messages and goes silent
// cannot starve the others, nor make this worker hold more than its budget.
func TestStalledStreamsLoseTheirMemory(t *testing.T) {
	b := newReceiveBudget(1<<20, slog.Default())
	b.idleLimit = 100 * time.Millisecond
	hog := newReassembler(testctx.For(t), 1<<20, b, "hog")
	hog.add(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{1 << 20}})
	if _, _, _, err := hog.add(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: make([]byte, 64<<10)}); err != nil {
		t.Fatal(err)
	}
	honest := newReassembler(testctx.For(t), 1<<20, b, "honest")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	honest.ctx = ctx
	if _, _, _, err := honest.add(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{1 << 19}}); err != nil {
		t.Fatalf("the honest message never got the budget the stalled one held: %v", err)
	}
	if hog.messages[1].buf != nil {
		t.Fatal("the stalled message's memory was not freed with its budget")
	}
	if _, _, _, err := hog.add(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: 64 << 10, Payload: []byte{1}}); !errors.Is(err, errProtocol) || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("the stalled stream's next chunk: err = %v, want it dropped", err)
	}
	hog.close()
	honest.close()
	if used := b.inUse(); used != 0 {
		t.Fatalf("%d bytes still reserved", used)
	}
}

// TestAStreamWaitingForBudgetKeepsItsOwnMessages: a stream with a message under way that waits
// for room for another is silent by this worker's doing: its own waiting must not take its
// message's memory away (nor anyone's, once they are held up by this worker).
func TestAStreamWaitingForBudgetKeepsItsOwnMessages(t *testing.T) {
	b := newReceiveBudget(1<<20, slog.Default())
	b.idleLimit = 50 * time.Millisecond
	s := newReassembler(testctx.For(t), 1<<20, b, "busy")
	s.add(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{1 << 20}})
	// Another message in turns would need overdraft beyond what is left: it waits.
	b.used += interleaveWindow
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	s.ctx = ctx
	if _, _, _, err := s.add(&wire.Frame{Kind: wire.FrameRequest, ID: 2, Sizes: []int64{1 << 10}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the wait to run out", err)
	}
	if s.messages[1].evicted {
		t.Fatal("a stream's own wait for budget took its message's memory")
	}
	b.used -= interleaveWindow
	s.close()
}

func TestTruncateTextKeepsHeadAndTail(t *testing.T) {
	long := "HEAD" + strings.Repeat("x", 1<<20) + "TAIL"
	got := truncateText(long, 1000)
	if len(got) > 1000 || !strings.HasPrefix(got, "HEAD") || !strings.HasSuffix(got, "TAIL") || !strings.Contains(got, "bytes left out") {
		t.Fatalf("truncateText gave %d bytes: %.80q...", len(got), got)
	}
	if truncateText("short", 1000) != "short" {
		t.Fatal("a short text changed")
	}
}

// TestALandingIsAdoptedOrGivenBack: a header's landing (memory the peer writes the chunks into)
// becomes the message's memory when it holds the message exactly, and its chunks are then
// decoded into where they already are; every other way a message ends (refused, aborted,
// evicted, the stream closed, a landing of the wrong size, completed and released) gives the
// landing back.
func TestALandingIsAdoptedOrGivenBack(t *testing.T) {
	const size = 1 << 16
	tests := []struct {
		name        string
		landing     int   // its length
		limit       int64 // the message size limit
		then        func(t *testing.T, r *reassembler, b *receiveBudget)
		wantAdopted bool
	}{
		{name: "completed and released", landing: size, limit: 1 << 20, wantAdopted: true, then: func(t *testing.T, r *reassembler, b *receiveBudget) {
			dst, ok := r.dest(1, 0, size)
			if !ok {
				t.Fatal("no place for the chunk")
			}
			_, msg, _, err := r.add(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: dst, Sink: r.dest})
			if err != nil || !msg.Pooled() || len(msg.Payload) != size {
				t.Fatalf("no whole lendable message: %v", err)
			}
			msg.Release()
			msg.Release()
		}},
		{name: "refused", landing: size, limit: size - 1},
		{name: "of the wrong size", landing: size - 1, limit: 1 << 20, then: func(t *testing.T, r *reassembler, b *receiveBudget) {
			if dst, _ := r.dest(1, 0, size); len(dst) != size {
				t.Fatal("no pooled memory for a message whose landing does not fit it")
			}
			r.close()
		}},
		{name: "aborted", landing: size, limit: 1 << 20, wantAdopted: true, then: func(t *testing.T, r *reassembler, b *receiveBudget) {
			r.add(&wire.Frame{Kind: wire.FrameAbort, ID: 1})
		}},
		{name: "the stream closed", landing: size, limit: 1 << 20, wantAdopted: true, then: func(t *testing.T, r *reassembler, b *receiveBudget) {
			r.close()
		}},
		{name: "evicted", landing: size, limit: 1 << 20, wantAdopted: true, then: func(t *testing.T, r *reassembler, b *receiveBudget) {
			if !r.messages[1].res.evict() {
				t.Fatal("the message could not be evicted")
			}
			r.close()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newReceiveBudget(1<<20, slog.Default())
			r := newReassembler(testctx.For(t), tt.limit, b, "peer")
			landing := make([]byte, tt.landing)
			released := 0 // as SetLanding asks, a release gives the landing back once
			head := &wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{size}}
			head.SetLanding(landing, func() { released = 1 })
			if _, _, _, err := r.add(head); err != nil {
				t.Fatal(err)
			}
			if m := r.messages[1]; m != nil && tt.wantAdopted {
				if len(m.buf) != size || &m.buf[0] != &landing[0] {
					t.Fatal("the message is not reassembled in its landing")
				}
			}
			if tt.then != nil {
				tt.then(t, r, b)
			}
			if released != 1 {
				t.Fatal("the landing was not given back")
			}
		})
	}
}

// TestEvictionTakesAMessageADecoderIsStuckIn: a decoder can stay inside a chunk for ever (over
// shared memory, a frame bigger than the ring whose sender stopped mid-frame, or a read of lent
// pages that never fault in). The budget its message holds still goes back to others waiting,
// its stream is ended, and the memory the decoder writes into is not handed to anyone else.
func TestEvictionTakesAMessageADecoderIsStuckIn(t *testing.T) {
	b := newReceiveBudget(4<<20, slog.Default())
	b.idleLimit = 50 * time.Millisecond
	stuck := newReassembler(testctx.For(t), 1<<30, b, "stuck peer")
	broke := make(chan error, 1)
	stuck.breakStream = func(err error) { broke <- err }
	if _, _, _, err := stuck.add(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Sizes: []int64{4 << 20}}); err != nil {
		t.Fatal(err)
	}
	dst, ok := stuck.dest(1, 0, 2<<20) // the decode starts, and never ends
	if !ok || dst == nil {
		t.Fatal("no place for the first chunk")
	}
	honest := newReassembler(testctx.For(t), 1<<30, b, "honest peer")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	honest.ctx = ctx
	if _, _, _, err := honest.add(&wire.Frame{Kind: wire.FrameRequest, ID: 7, Sizes: []int64{1 << 20}}); err != nil {
		t.Fatalf("the honest message never got the budget a stuck decoder's message held: %v", err)
	}
	select {
	case err := <-broke:
		if !errors.Is(err, errProtocol) || !strings.Contains(err.Error(), "stuck peer stalled inside a chunk") {
			t.Fatalf("the stuck stream was ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stuck stream was not ended")
	}
	if again := bufpool.Shared.Get(4 << 20); &again[0] == &dst[0] {
		t.Fatal("the memory a decoder still writes into went back to the pool")
	}
	if _, _, _, err := stuck.add(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: 0, Payload: []byte{1}}); !errors.Is(err, errProtocol) {
		t.Fatalf("a chunk of the evicted message: err = %v, want the stream dropped", err)
	}
	stuck.close()
	honest.close()
	if used := b.inUse(); used != 0 {
		t.Fatalf("%d bytes still reserved", used)
	}
}

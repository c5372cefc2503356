package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

const (
	// interleaveWindow bounds the bytes of big messages one stream sends in turns: a writer
	// starts another big message while one is under way only if both fit in it, so a receiver
	// never needs more than this much memory on one stream beyond a message it waited for.
	interleaveWindow = 64 << 20
	// maxInterleaved bounds how many big messages one stream sends in turns.
	maxInterleaved = 64
)

// reassembler rebuilds the chunked messages arriving on one stream direction. Every size and
// offset a peer announces is checked, without overflow, before it is used; the memory of a
// message is reserved from the agent's receive budget when its header arrives and allocated
// when its first chunk does.
type reassembler struct {
	maxSize  int64
	budget   *receiveBudget
	ctx      context.Context // waits for budget end with it
	peer     string          // who sends on this stream, for logs
	messages map[uint64]*inMessage
	// inProgress is the bytes announced by the messages being received on this stream.
	inProgress int64

	// active is when the last frame arrived (unix nanoseconds), and holds counts the waits of
	// this worker's own making that keep the stream from being read: the receive budget can
	// take memory back only from a stream that is silent by its sender's doing.
	active atomic.Int64
	holds  atomic.Int32
	// breakStream ends the stream (its owner sets it, before frames come): eviction calls it
	// to take back a message a decoder is stuck writing (see evictor).
	breakStream func(error)
	// mu guards the memory of messages (buf, writing, evicted) against the budget's eviction,
	// which runs on another stream's goroutine, and the messages map's changes against a
	// stream's decoder (dest).
	mu sync.Mutex
}

type inMessage struct {
	header *wire.Frame
	sizes  []int64
	total  int64
	buf    []byte // allocated at the first chunk, or the landing; nil for a refused message
	// release gives buf back: to the shared pool, or a landing to the stream it came from.
	release  func()
	landed   bool // buf is a landing (wire.Frame.SetLanding): the peer writes the chunks into it
	received int64
	refused  bool         // over a limit: its chunks are read and dropped
	res      *reservation // its memory in the receive budget
	writing  bool         // a decoder is writing a chunk into buf
	evicted  bool         // the budget took its memory back: the stream is to be dropped
}

func newReassembler(ctx context.Context, maxSize int64, budget *receiveBudget, peer string) *reassembler {
	r := &reassembler{maxSize: maxSize, budget: budget, ctx: ctx, peer: peer, messages: map[uint64]*inMessage{}}
	r.active.Store(time.Now().UnixNano())
	return r
}

// hold marks a wait of this worker's own making, while which the stream is not read; the
// returned function ends it.
func (r *reassembler) hold() (unhold func()) {
	r.holds.Add(1)
	return func() {
		r.stamp()
		r.holds.Add(-1)
	}
}

// stamp records that the stream is active now. Only a stream with big messages under way
// holds budget the way eviction judges, so the others, small calls among them, skip the
// clock read.
func (r *reassembler) stamp() {
	if r.inProgress > 0 {
		r.active.Store(time.Now().UnixNano())
	}
}

// stalled implements holder.
func (r *reassembler) stalled(stale int64) bool {
	return r.holds.Load() == 0 && r.active.Load() < stale
}

// evictor returns m's eviction: its memory goes back to the budget, and its stream is to be
// dropped. A decoder can stay inside a chunk for ever (a shared-memory frame bigger than the
// ring whose sender stopped mid-frame, a read of lent pages that never fault in): then the
// stream is ended now, to free whoever waits on it, and m's memory is left to the garbage
// collector once the decoder lets go, never to the pool, which would hand it to another message
// while the decoder still writes.
func (r *reassembler) evictor(m *inMessage) func() bool {
	return func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		m.evicted = true
		if m.buf != nil && (!m.writing || m.landed) {
			m.release()
		}
		m.buf = nil
		if m.writing && r.breakStream != nil {
			go r.breakStream(fmt.Errorf("%w: %s stalled inside a chunk of a message holding receive budget others needed", errProtocol, r.peer))
		}
		return true
	}
}

// errProtocol marks frames no honest peer sends; the stream that carried them is dropped.
var errProtocol = errors.New("protocol violation")

// add takes one frame. It returns a frame ready to handle and its message (the frame itself
// when it is not chunked, or the completed message), nothing while a message is incomplete,
// or refused: the header of a message this worker will not take (over its size limit or its
// receive budget), whose chunks it drops. err is a protocol violation: the stream must end.
// add may wait for room in the receive budget.
func (r *reassembler) add(f *wire.Frame) (fr *wire.Frame, msg Message, refused error, err error) {
	r.stamp()
	landing, releaseLanding := f.TakeLanding()
	defer func() {
		if releaseLanding != nil { // not adopted by the message (below)
			releaseLanding()
		}
	}()
	switch f.Kind {
	case wire.FrameChunk:
		fr, msg, err = r.chunk(f)
		return fr, msg, nil, err
	case wire.FrameAbort:
		if m := r.messages[f.ID]; m != nil {
			r.drop(f.ID, m)
		}
		return nil, Message{}, nil, nil
	}
	if len(f.Sizes) == 0 {
		return f, Message{Payload: f.Payload, Buffers: f.Buffers, release: f.TakeRecycle()}, nil, nil
	}
	if len(f.Sizes) > wire.MaxBuffersPerMessage {
		return nil, Message{}, nil, fmt.Errorf("%w: message %d announces %d buffers, more than %d", errProtocol, f.ID, len(f.Sizes), wire.MaxBuffersPerMessage)
	}
	if _, dup := r.messages[f.ID]; dup {
		return nil, Message{}, nil, fmt.Errorf("%w: message %d announced twice", errProtocol, f.ID)
	}
	if len(r.messages) >= maxInterleaved {
		return nil, Message{}, nil, fmt.Errorf("%w: more than %d big messages under way at once", errProtocol, maxInterleaved)
	}
	// The total saturates instead of wrapping: sizes that overflow int64 are merely too large.
	var total int64
	for _, n := range f.Sizes {
		if n < 0 {
			return nil, Message{}, nil, fmt.Errorf("%w: message %d announces a negative size", errProtocol, f.ID)
		}
		if n > math.MaxInt64-total {
			total = math.MaxInt64
			break
		}
		total += n
	}
	if r.inProgress > 0 && (total > interleaveWindow-r.inProgress) {
		return nil, Message{}, nil, fmt.Errorf("%w: message %d of %d bytes announced while %d bytes are under way (the window is %d)", errProtocol, f.ID, total, r.inProgress, interleaveWindow)
	}
	m := &inMessage{header: f, sizes: f.Sizes, total: total}
	f.Sizes = nil
	switch {
	case total > r.maxSize:
		refused = fmt.Errorf("%w: it carries %d bytes, over this worker's %d-byte limit", ErrTooLarge, total, r.maxSize)
	case total > r.budget.limit:
		refused = fmt.Errorf("%w: it carries %d bytes, more than this worker's %d-byte receive budget", ErrTooLarge, total, r.budget.limit)
	default:
		res := &reservation{n: total, peer: r.peer, holder: r, evict: r.evictor(m)}
		// A message sent in turns with one under way must not wait for that one's memory: it
		// may take a window's worth over the budget.
		if r.inProgress == 0 || !r.budget.tryReserve(res, interleaveWindow) {
			unhold := r.hold()
			err := r.budget.reserve(r.ctx, res)
			// Start the clock before the hold ends: the reservation is held from here on.
			r.active.Store(time.Now().UnixNano())
			unhold()
			if err != nil {
				return nil, Message{}, nil, err
			}
		}
		m.res = res
	}
	m.refused = refused != nil
	if !m.refused && total > 0 && int64(len(landing)) == total {
		// The peer writes the chunks into the landing itself: the message is reassembled there.
		m.buf, m.release, m.landed = landing, releaseLanding, true
		releaseLanding = nil
	}
	r.mu.Lock()
	r.messages[f.ID] = m
	r.mu.Unlock()
	r.inProgress += total
	if total == 0 {
		fr, msg = r.complete(f.ID, m)
		return fr, msg, nil, nil
	}
	if refused != nil {
		return m.header, Message{}, refused, nil
	}
	return nil, Message{}, nil, nil
}

// place checks a chunk of n bytes at offset of message id, without overflow, and returns the
// message it belongs to.
func (r *reassembler) place(id uint64, offset int64, n int) (*inMessage, error) {
	m := r.messages[id]
	if m == nil {
		return nil, fmt.Errorf("%w: chunk of unknown message %d", errProtocol, id)
	}
	if offset < 0 || n < 0 || offset > m.total || int64(n) > m.total-offset {
		return nil, fmt.Errorf("%w: chunk of message %d at %d+%d lies outside its %d bytes", errProtocol, id, offset, n, m.total)
	}
	// Writers send a message's chunks in order. Anything else could leave parts of a pooled
	// buffer unwritten, and those hold an earlier message's bytes.
	if offset != m.received {
		return nil, fmt.Errorf("%w: chunk of message %d at %d, but %d bytes have arrived", errProtocol, id, offset, m.received)
	}
	return m, nil
}

// claim readies m's memory for a chunk (allocating it at the first) and marks it being
// written, so the budget cannot take it back meanwhile; r.mu is held.
func (r *reassembler) claim(id uint64, m *inMessage) error {
	if m.evicted {
		return fmt.Errorf("%w: message %d stalled while holding receive budget others needed", errProtocol, id)
	}
	if !m.refused && m.buf == nil {
		m.buf = bufpool.Shared.Get(int(m.total))
		m.release = bufpool.Shared.PutOnce(m.buf)
	}
	m.writing = !m.refused
	return nil
}

// dest is the memory a chunk of message id at offset, n bytes long, belongs in; nil with ok
// set means the chunk's bytes are to be dropped, and ok unset that no message being received
// has such a place. transport.Stream decoders put chunks there directly.
func (r *reassembler) dest(id uint64, offset int64, n int) (dst []byte, ok bool) {
	// Under r.mu: a stream may decode on a goroutine of its own (gRPC's lanes), which can
	// still be at it when the stream's owner closes the reassembler.
	r.mu.Lock()
	defer r.mu.Unlock()
	m, err := r.place(id, offset, n)
	if err != nil {
		return nil, false
	}
	if r.claim(id, m) != nil {
		return nil, false
	}
	if m.refused {
		return nil, true
	}
	return m.buf[offset : offset+int64(n)], true
}

// attach lets s decode chunks straight into the messages being received, if it can.
func (r *reassembler) attach(s transport.Stream) {
	if ss, ok := s.(transport.SinkSetter); ok {
		ss.SetChunkSink(r.dest)
	}
}

func (r *reassembler) chunk(f *wire.Frame) (*wire.Frame, Message, error) {
	// A placed chunk was checked and put in place (or dropped) by the decoder already.
	n, placed := f.Placed()
	m := r.messages[f.ID]
	if !placed {
		var err error
		if m, err = r.place(f.ID, f.Offset, n); err != nil {
			return nil, Message{}, err
		}
		r.mu.Lock()
		if err := r.claim(f.ID, m); err != nil {
			r.mu.Unlock()
			return nil, Message{}, err
		}
		if !m.refused {
			copy(m.buf[f.Offset:], f.Payload)
		}
		m.writing = false
		r.mu.Unlock()
	} else {
		r.mu.Lock()
		m.writing = false
		evicted := m.evicted
		r.mu.Unlock()
		if evicted { // while the decoder wrote the chunk
			return nil, Message{}, fmt.Errorf("%w: message %d stalled while holding receive budget others needed", errProtocol, f.ID)
		}
	}
	m.received += int64(n)
	if m.received < m.total {
		return nil, Message{}, nil
	}
	fr, msg := r.complete(f.ID, m)
	return fr, msg, nil
}

// complete ends the reassembly of m: its budget goes back (the message now belongs to whoever
// handles it) and its segments are cut from its buffer. A refused message yields nothing.
func (r *reassembler) complete(id uint64, m *inMessage) (*wire.Frame, Message) {
	r.mu.Lock()
	delete(r.messages, id)
	buf := m.buf
	m.buf = nil
	r.mu.Unlock()
	r.inProgress -= m.total
	r.budget.free(m.res)
	if m.refused {
		return nil, Message{}
	}
	if buf == nil { // an empty message
		buf = []byte{}
		return m.header, cutMessage(buf, m.sizes, bufpool.Shared.PutOnce(buf))
	}
	return m.header, cutMessage(buf, m.sizes, m.release)
}

// drop forgets an incomplete message and returns its memory, unless a decoder is writing a
// chunk into pooled memory (then the garbage collector takes it). A landing always goes back:
// its stream holds it, and a decoder writes there only what the peer already put there.
func (r *reassembler) drop(id uint64, m *inMessage) {
	r.inProgress -= m.total
	r.budget.free(m.res)
	r.mu.Lock()
	delete(r.messages, id)
	buf := m.buf
	m.buf = nil
	giveBack := buf != nil && (!m.writing || m.landed)
	r.mu.Unlock()
	if giveBack {
		m.release()
	}
}

// close drops incomplete messages.
func (r *reassembler) close() {
	r.mu.Lock()
	messages := maps.Clone(r.messages)
	r.mu.Unlock()
	for id, m := range messages {
		r.drop(id, m)
	}
}

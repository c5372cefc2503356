package core

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// frameWriter owns the sending side of one stream. Small frames go out first, in order; big
// messages are cut into chunks sent in turn with each other and with small frames, so a small
// call is never stuck behind a big transfer to the same peer.
type frameWriter struct {
	stream    transport.Stream
	chunkSize int
	onError   func(error)
	// takeRefOps, on a stream to a peer, gives the reference operations queued for RRefs it
	// owns (peer.takeRefOps); requests take them along.
	takeRefOps func(limit int) (ops []wire.RefOp, firstSeq uint64)

	mu    sync.Mutex
	wake  chan struct{}
	small []*outMessage
	large []*outMessage
	err   error
	// underWay is the bytes of the big messages started and not finished, underWayCount
	// their number.
	underWay      int64
	underWayCount int

	// sendMu is held around every Stream.Send of a small frame. A small frame that finds the
	// writer idle is sent by the calling goroutine itself: a hand-off to the writer goroutine
	// costs a thread wake-up (measured: 20-40 us of a 500 us small call on a 2-core VM).
	sendMu sync.Mutex
	// bulkMu is held around a Send of a big message's frames: sendMu itself, unless the
	// stream carries them in a lane of their own (transport.Laned), where a chunk waiting for
	// room must not hold up small frames.
	bulkMu  *sync.Mutex
	ownBulk sync.Mutex
}

// outMessage is a queued frame and, for a big message, the data it sends in chunks.
type outMessage struct {
	header   *wire.Frame
	segments [][]byte
	total    int64
	offset   int64 // bytes sent so far
	started  bool  // the header went out
	turn     int   // bytes sent in its current turn
	aborted  bool
	sent     chan struct{} // closed once neither the writer nor the peer reads the message's memory
	onSent   func()        // if set, run once sent is closed
}

// finish closes m.sent: neither the writer nor the peer reads m's memory any more.
func (m *outMessage) finish() {
	close(m.sent)
	if m.onSent != nil {
		m.onSent()
	}
}

func newFrameWriter(s transport.Stream, chunkSize int, onError func(error)) *frameWriter {
	w := &frameWriter{stream: s, chunkSize: chunkSize, onError: onError, wake: make(chan struct{}, 1)}
	w.bulkMu = &w.sendMu
	if _, laned := s.(transport.Laned); laned {
		w.bulkMu = &w.ownBulk
	}
	go w.run()
	return w
}

// closedChan is the sent channel of messages the writer was done with at once.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// send queues f carrying msg; a big msg follows f in chunks. The returned message's sent
// channel is closed once msg's memory is no longer read (sent, and read by a peer that reads
// it from this process's memory; or dropped after an error), and then onSent, if set, runs (on
// the writer's goroutine, or the one that waited for the peer to read: it must not block). If
// send fails, onSent does not run.
func (w *frameWriter) send(f *wire.Frame, msg Message, onSent func()) (*outMessage, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return nil, w.err
	}
	size := int64(msg.Size())
	// Taken under w.mu, which orders frames on the stream: a fork's registration is sent
	// before the message carrying it and before any later release.
	var refOps []wire.RefOp
	var refSeq uint64
	if w.takeRefOps != nil && (f.Kind == wire.FrameRequest || f.Kind == wire.FrameRefs) {
		refOps, refSeq = w.takeRefOps(wire.MaxBuffersPerMessage)
	}
	if size < int64(w.chunkSize) {
		f.Payload, f.Buffers = msg.Payload, msg.Buffers
		if len(refOps) > 0 {
			f.Refs, f.RefSeq = refOps, refSeq
		}
		if f.Kind == wire.FrameRefs && len(f.Refs) == 0 && f.RefSeq == 0 {
			return &outMessage{header: f, sent: closedChan}, nil // another frame took them
		}
		if len(w.small) == 0 && w.sendMu.TryLock() {
			w.mu.Unlock()
			err := w.stream.Send(f)
			w.sendMu.Unlock()
			w.mu.Lock()
			if err != nil {
				if w.err == nil {
					w.err = err
				}
				w.kick()
				return nil, err
			}
			if onSent != nil {
				onSent()
			}
			return &outMessage{header: f, sent: closedChan}, nil
		}
		m := &outMessage{header: f, sent: make(chan struct{}), onSent: onSent}
		w.small = append(w.small, m)
		w.kick()
		return m, nil
	}
	sizes := make([]int64, 0, 1+len(msg.Buffers))
	segments := make([][]byte, 0, 1+len(msg.Buffers))
	sizes = append(sizes, int64(len(msg.Payload)))
	segments = append(segments, msg.Payload)
	for _, b := range msg.Buffers {
		sizes = append(sizes, int64(len(b)))
		segments = append(segments, b)
	}
	f.Sizes = sizes
	if len(refOps) > 0 {
		// Small frames overtake a big message's header: the operations go ahead of it in a
		// frame of their own, and no later release can pass them.
		w.small = append(w.small, &outMessage{header: &wire.Frame{Kind: wire.FrameRefs, Refs: refOps, RefSeq: refSeq}, sent: make(chan struct{})})
	}
	m := &outMessage{header: f, segments: segments, total: size, sent: make(chan struct{}), onSent: onSent}
	w.large = append(w.large, m)
	w.kick()
	return m, nil
}

// sendFrame queues a frame that carries only what is in it (no big message).
func (w *frameWriter) sendFrame(f *wire.Frame) error {
	_, err := w.send(f, Message{Payload: f.Payload, Buffers: f.Buffers}, nil)
	return err
}

// sendRefOps sends the queued reference operations that no request took along.
func (w *frameWriter) sendRefOps() error {
	for {
		out, err := w.send(&wire.Frame{Kind: wire.FrameRefs}, Message{}, nil)
		if err != nil || len(out.header.Refs) < wire.MaxBuffersPerMessage {
			return err
		}
	}
}

// abandonGrace is how long a peer may hold the memory of a big message whose call gave up:
// the time to take the chunk being sent, or to read what was lent to it (transport.Lending).
// A peer that runs does so in milliseconds; one still holding it after this is frozen
// (SIGSTOP, a debugger) or cut off, and would hold the caller's memory, and so the call, for
// as long as that lasts (over gRPC, until its keepalive gives up). Its stream is then ended,
// which takes the memory back, and the calls on it fail naming it.
var abandonGrace = 2 * time.Second

// abort stops sending m; the peer is told if it has seen m's header.
func (w *frameWriter) abort(m *outMessage) {
	if m == nil {
		return
	}
	w.mu.Lock()
	m.aborted = true
	started := m.started
	w.kick()
	w.mu.Unlock()
	if started {
		time.AfterFunc(abandonGrace, func() {
			select {
			case <-m.sent:
			default:
				w.onError(fmt.Errorf("it held the memory of a big message for %v after the message's call gave up", abandonGrace))
			}
		})
	}
}

func (w *frameWriter) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// close fails the writer: queued frames are dropped and big messages released.
func (w *frameWriter) close(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.kick()
	w.mu.Unlock()
}

// next picks what to write: a small frame if any, else the next chunk of the big message
// whose turn it is. done is set when m's memory is no longer needed after f is written.
func (w *frameWriter) next() (f *wire.Frame, m *outMessage, done bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if w.err != nil {
			return nil, nil, false, w.err
		}
		if len(w.small) > 0 {
			m = w.small[0]
			w.small[0] = nil
			w.small = w.small[1:]
			return m.header, m, true, nil
		}
		if m = w.takeLarge(); m == nil {
			return nil, nil, false, nil
		}
		switch {
		case m.aborted && !m.started:
			m.finish()
			continue
		case m.aborted:
			// m is finished once the abort is sent: a peer reading lent memory may still be
			// reading an earlier chunk.
			w.finished(m)
			return &wire.Frame{Kind: wire.FrameAbort, ID: m.header.ID}, m, true, nil
		case !m.started:
			m.started = true
			w.underWay += m.total
			w.underWayCount++
			w.large = slices.Insert(w.large, 0, m) // the header is not its turn's worth
			return m.header, nil, false, nil
		}
		n := w.chunkLength()
		f = &wire.Frame{Kind: wire.FrameChunk, ID: m.header.ID, Offset: m.offset, Payload: m.chunk(n)}
		m.offset += int64(len(f.Payload))
		if m.offset < m.total {
			// A turn is a chunk's length of bytes: a chunk cut short by the end of a segment
			// (a pickle of a few hundred bytes before an array) keeps the turn, or a message
			// of many segments would wait a whole round of others' chunks for each.
			m.turn += len(f.Payload)
			if m.turn >= n {
				m.turn = 0
				w.large = append(w.large, m)
			} else {
				w.large = slices.Insert(w.large, 0, m)
			}
			return f, m, false, nil
		}
		w.finished(m)
		return f, m, true, nil
	}
}

// chunkLength is how long the next chunk is: what a lending stream asks for, else the agent's
// chunk size.
func (w *frameWriter) chunkLength() int {
	if l, ok := w.stream.(transport.Lending); ok {
		if n := l.ChunkBytes(); n > 0 {
			return n
		}
	}
	return w.chunkSize
}

// takeLarge removes and returns the first big message that may be served now: one under way,
// an aborted one, or one that may start. Big messages take turns only within the interleave
// window (the receiver holds memory for every message under way); a bigger one goes alone.
// They start in the order they were queued, so a big one is not passed forever by smaller
// ones that fit the window.
func (w *frameWriter) takeLarge() *outMessage {
	blocked := false // an earlier message is waiting to start
	for i, m := range w.large {
		mayStart := !blocked && (w.underWayCount == 0 || (w.underWayCount < maxInterleaved && m.total <= interleaveWindow-w.underWay))
		if m.started || m.aborted || mayStart {
			w.large = append(w.large[:i], w.large[i+1:]...)
			return m
		}
		blocked = true
	}
	return nil
}

// finished takes m, which was started, off the messages under way.
func (w *frameWriter) finished(m *outMessage) {
	w.underWay -= m.total
	w.underWayCount--
}

// chunk returns up to n bytes of the message from its offset, without copying: a chunk ends
// at the end of its segment.
func (m *outMessage) chunk(n int) []byte {
	at := m.offset
	for _, seg := range m.segments {
		if at >= int64(len(seg)) {
			at -= int64(len(seg))
			continue
		}
		return seg[at:min(int64(len(seg)), at+int64(n))]
	}
	return nil
}

func (w *frameWriter) run() {
	for {
		// sendMu is taken before a frame leaves the queue, not after: a small frame that its
		// caller sends itself (send's fast path) cannot go out ahead of one queued before it.
		// The order matters: an RRef fork's registration must reach the owner before its
		// parent's release.
		w.sendMu.Lock()
		f, m, done, err := w.next()
		if err != nil {
			w.sendMu.Unlock()
			w.drain()
			return
		}
		if f == nil {
			w.sendMu.Unlock()
			<-w.wake
			continue
		}
		mu := &w.sendMu
		if transport.Bulk(f) && w.bulkMu != &w.sendMu {
			w.sendMu.Unlock()
			mu = w.bulkMu
			mu.Lock()
		}
		err = w.stream.Send(f)
		mu.Unlock()
		if err != nil {
			w.close(err)
			if m != nil && done {
				w.giveBack(m)
			}
			w.drain()
			w.onError(err)
			return
		}
		if done {
			w.release(m)
		}
	}
}

// release finishes m once it is sent. A big message's last chunks may still be read from m's
// memory by the peer (transport.Lending): its memory is given back once the peer has read
// them, waited for aside so that the next message's chunks go out meanwhile.
func (w *frameWriter) release(m *outMessage) {
	lending, ok := w.stream.(transport.Lending)
	if !ok || !m.started {
		m.finish()
		return
	}
	// Taken now: m's last chunk is the last one sent, and m is not to wait for the next
	// message's chunks to be read.
	settled := lending.Settled()
	go func() {
		// On an error the wait revoked the loans: the peer reads nothing more of m.
		_ = settled()
		m.finish()
	}()
}

// giveBack finishes m, which will not be sent whole: the writer failed. The peer may still be
// reading chunks lent from m's memory, so the loans are revoked first.
func (w *frameWriter) giveBack(m *outMessage) {
	if lending, ok := w.stream.(transport.Lending); ok && m.started {
		lending.Revoke()
	}
	m.finish()
}

// drain releases every big message still queued once the writer has failed.
func (w *frameWriter) drain() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.small {
		m.finish()
	}
	for _, m := range w.large {
		w.giveBack(m)
	}
	w.large, w.small = nil, nil
}

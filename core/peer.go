package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// peer is this agent's view of another worker as a callee: the stream it dialed to it and the
// calls waiting on that stream.
type peer struct {
	agent *Agent
	info  WorkerInfo

	mu      sync.Mutex
	conn    *peerConn     // nil until dialed, and again after the stream breaks
	dialing chan struct{} // closed when the dial under way ends
	left    error         // set once the worker left the world: every call fails with it
	// broke, if set, hears that a stream to the peer broke or could not open (a dynamic
	// world then asks whether the worker is gone).
	broke func()

	// Reference operations for RRefs the peer owns, numbered from 1 in the order they were
	// made (wire.Frame.RefSeq). refLog holds those the peer has not acknowledged, oldest first,
	// numbered refAcked+1 on. The first refSent of them went out on the stream of generation
	// refGen (requests take them along, see frameWriter); a new stream sends them all again,
	// and the owner applies each once, so an operation lost with a broken stream is not lost.
	refMu    sync.Mutex
	refLog   []wire.RefOp
	refAcked uint64
	refSent  int
	refGen   uint64
}

func (p *peer) queueRefOp(op wire.RefOp) {
	p.refMu.Lock()
	p.refLog = append(p.refLog, op)
	p.refMu.Unlock()
}

// retractRefAdd removes op, a registration, if it has not been sent yet; numbers are given to
// operations only as they are sent, so the ones after it keep their order and count.
func (p *peer) retractRefAdd(op wire.RefOp) bool {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	for i := len(p.refLog) - 1; i >= p.refSent; i-- {
		if p.refLog[i] == op {
			p.refLog = slices.Delete(p.refLog, i, i+1)
			return true
		}
	}
	return false
}

// hasRefOps reports whether operations wait to be sent.
func (p *peer) hasRefOps() bool {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	return len(p.refLog) > p.refSent
}

// takeRefOps returns up to limit operations not yet sent on the stream of generation gen,
// oldest first, and the number of the first; a stream that is no longer the current one
// takes none.
func (p *peer) takeRefOps(gen uint64, limit int) ([]wire.RefOp, uint64) {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	n := min(limit, len(p.refLog)-p.refSent)
	if gen != p.refGen || n <= 0 {
		return nil, 0
	}
	ops := slices.Clone(p.refLog[p.refSent : p.refSent+n])
	first := p.refAcked + uint64(p.refSent) + 1
	p.refSent += n
	return ops, first
}

// newRefStream starts a stream generation: every unacknowledged operation goes again.
func (p *peer) newRefStream() uint64 {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	p.refGen++
	p.refSent = 0
	return p.refGen
}

// ackRefOps forgets the operations the owner says it applied, up to number seq.
func (p *peer) ackRefOps(seq uint64) {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	if seq <= p.refAcked {
		return
	}
	k := int(min(seq-p.refAcked, uint64(len(p.refLog))))
	p.refLog = slices.Clone(p.refLog[k:])
	p.refAcked += uint64(k)
	p.refSent = max(0, p.refSent-k)
}

// resendRefOpsAfter takes the owner's word that it applied the operations up to number
// applied and refused those after for a gap: they all go again, from the next frame on.
func (p *peer) resendRefOpsAfter(applied uint64, log *slog.Logger) {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	if applied < p.refAcked {
		// Operations it says it never applied were acknowledged before and are gone: only a
		// restarted owner (whose values went with it) says so.
		log.Warn("tensorplay-rpc: an RRef owner lost reference operations it had acknowledged", "owner", p.info.Name, "applied", applied, "acknowledged", p.refAcked)
		return
	}
	k := int(min(applied-p.refAcked, uint64(len(p.refLog))))
	p.refLog = slices.Clone(p.refLog[k:])
	p.refAcked += uint64(k)
	p.refSent = 0
}

// dropRefOps forgets every operation for the peer: it left the world, and its values with it.
func (p *peer) dropRefOps() int {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	n := len(p.refLog)
	p.refAcked += uint64(n)
	p.refLog, p.refSent = nil, 0
	return n
}

// peerConn is one stream to a peer and its table of pending calls.
type peerConn struct {
	peer   *peer
	stream transport.Stream
	writer *frameWriter
	ctx    context.Context // ends when the stream fails
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[uint64]*CallFuture
	broken  error

	// selfReader is set while a thread waiting for its reply reads the stream itself: one at
	// a time (CallFuture.AwaitReading).
	selfReader atomic.Bool
}

// connect returns the live stream to the peer, dialing it if there is none. Concurrent
// callers share one dial.
func (p *peer) connect(ctx context.Context) (*peerConn, error) {
	for {
		p.mu.Lock()
		if p.left != nil {
			p.mu.Unlock()
			return nil, p.left
		}
		if c := p.conn; c != nil {
			p.mu.Unlock()
			return c, nil
		}
		if ch := p.dialing; ch != nil {
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		p.dialing = ch
		p.mu.Unlock()

		c, err := p.dial(ctx)
		p.mu.Lock()
		p.dialing = nil
		if err == nil && p.left != nil {
			p.mu.Unlock()
			c.fail(p.left)
			c, err = nil, p.left
			p.mu.Lock()
		}
		if err == nil {
			p.conn = c
		}
		hasLeft := p.left != nil
		p.mu.Unlock()
		close(ch)
		if err != nil && p.broke != nil && !hasLeft && ctx.Err() == nil {
			p.broke()
		}
		if err != nil {
			return nil, err
		}
		go c.readLoop()
		return c, nil
	}
}

func (p *peer) dial(ctx context.Context) (*peerConn, error) {
	s, err := p.agent.transport.Dial(ctx, p.info.Addr)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot reach worker %q at %s: %w", ErrPeerLost, p.info.Name, p.info.Addr, err)
	}
	c := &peerConn{peer: p, stream: s, pending: map[uint64]*CallFuture{}}
	c.ctx, c.cancel = context.WithCancel(p.agent.serveCtx)
	c.writer = newFrameWriter(s, p.agent.chunkSize, c.fail)
	gen := p.newRefStream()
	c.writer.takeRefOps = func(limit int) ([]wire.RefOp, uint64) { return p.takeRefOps(gen, limit) }
	self := p.agent.self
	if err := c.writer.sendFrame(wire.HelloFrame(self.Name, self.ID, p.agent.epoch)); err != nil {
		err = fmt.Errorf("%w: cannot open a stream to worker %q at %s: %w", ErrPeerLost, p.info.Name, p.info.Addr, err)
		c.writer.close(err) // ends its goroutine
		c.cancel()
		s.Close()
		return nil, err
	}
	return c, nil
}

// send registers f as pending under id and queues the request carrying msg.
func (c *peerConn) send(id uint64, f *CallFuture, req *wire.Frame, msg Message) error {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return c.broken
	}
	c.pending[id] = f
	c.mu.Unlock()
	out, err := c.writer.send(req, msg, nil)
	if err != nil {
		c.fail(err)
		return nil
	}
	if out != nil {
		f.setOutgoing(c.writer, out)
	}
	return nil
}

// take removes and returns the pending call id, if it is still pending.
func (c *peerConn) take(id uint64) *CallFuture {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.pending[id]
	delete(c.pending, id)
	return f
}

func (c *peerConn) readLoop() {
	a, name := c.peer.agent, c.peer.info.Name
	defer func() {
		if r := recover(); r != nil {
			reportPanic(a.log, name, "reading replies", r, c.fail)
		}
	}()
	incoming := newReassembler(c.ctx, a.maxMessageSize, a.receiveBudget, name)
	incoming.breakStream = c.fail
	incoming.attach(c.stream)
	defer incoming.close()
	for {
		fr, err := c.stream.Recv()
		if err != nil {
			c.fail(err)
			return
		}
		fr, msg, refused, err := incoming.add(fr)
		if err != nil {
			c.fail(fmt.Errorf("bad frame: %w", err))
			return
		}
		if fr != nil {
			c.deliver(fr, msg, refused)
		}
	}
}

// deliver takes one whole message from the stream: from the reader goroutine, or a small frame
// read by a thread waiting for its reply (CallFuture.AwaitReading), which needs no reassembly.
func (c *peerConn) deliver(fr *wire.Frame, msg Message, refused error) {
	a, name := c.peer.agent, c.peer.info.Name
	if fr.Kind == wire.FrameRefs && fr.Status == wire.RefsGap {
		c.peer.resendRefOpsAfter(fr.RefSeq, a.log)
		a.queueRefFlush()
	} else if fr.RefSeq > 0 && (fr.Kind == wire.FrameResponse || fr.Kind == wire.FrameRefs && len(fr.Refs) == 0) {
		c.peer.ackRefOps(fr.RefSeq)
	}
	if fr.Kind != wire.FrameResponse {
		msg.Release()
		if fr.Kind != wire.FrameRefs || len(fr.Refs) > 0 {
			a.log.Warn("tensorplay-rpc: unexpected frame from a callee; ignored", "worker", name, "kind", fr.Kind)
		}
		return
	}
	if refused != nil {
		// Only this call fails; its chunks are dropped as they come.
		if f := c.take(fr.ID); f != nil {
			f.complete(Message{}, fmt.Errorf("the reply of worker %q was refused: %w", name, refused))
		}
		return
	}
	if f := c.take(fr.ID); f != nil {
		resp, err := responseResult(fr, msg, name)
		if !f.complete(resp, err) {
			msg.Release() // the call's deadline completed it first
		}
	} else {
		msg.Release() // the caller gave up on it
	}
}

// leave fails the peer for good with why: it left the world. Calls waiting on it fail, and so
// does every later one, and its queued reference operations are dropped with its values.
func (p *peer) leave(why error) {
	p.mu.Lock()
	p.left = why
	c := p.conn
	p.mu.Unlock()
	if c != nil {
		c.fail(why)
	}
	p.dropRefOps()
}

// fail marks the stream broken, fails every call waiting on it with an error naming the peer,
// and lets the next call dial afresh.
func (c *peerConn) fail(cause error) {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return
	}
	p := c.peer
	c.broken = fmt.Errorf("%w: stream to worker %q at %s broke: %w", ErrPeerLost, p.info.Name, p.info.Addr, cause)
	if errors.Is(cause, ErrWorkerLeft) {
		c.broken = cause
	} else if p.agent.closing() {
		c.broken = fmt.Errorf("%w: the call to worker %q was still pending", ErrShutdown, p.info.Name)
	}
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()

	p.mu.Lock()
	if p.conn == c {
		p.conn = nil
	}
	p.mu.Unlock()
	c.cancel()
	c.writer.close(c.broken)
	c.stream.Close()
	for _, f := range pending {
		f.complete(Message{}, c.broken)
	}
	if p.broke != nil && !errors.Is(cause, ErrWorkerLeft) && !p.agent.closing() {
		p.broke()
	}
}

// responseResult turns a response frame from worker, carrying msg, into the caller's result.
func responseResult(fr *wire.Frame, msg Message, worker string) (Message, error) {
	switch fr.Status {
	case wire.ReplyOK:
		return msg, nil
	case wire.ReplyNoHandler:
		msg.Release()
		return Message{}, fmt.Errorf("%w: worker %q: %s", ErrNoHandler, worker, fr.Error)
	case wire.ReplyTooLarge:
		msg.Release()
		return Message{}, fmt.Errorf("%w: worker %q: %s", ErrTooLarge, worker, fr.Error)
	default:
		return Message{}, &RemoteError{Worker: worker, Message: fr.Error, Payload: msg}
	}
}

package core

import (
	"context"
	"fmt"
	"slices"
	"sync"

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

	// refOps are reference operations for RRefs the peer owns, in the order they were made;
	// the next request or reference frame to the peer takes them along (frameWriter).
	refMu  sync.Mutex
	refOps []wire.RefOp
}

func (p *peer) queueRefOp(op wire.RefOp) {
	p.refMu.Lock()
	p.refOps = append(p.refOps, op)
	p.refMu.Unlock()
}

func (p *peer) hasRefOps() bool {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	return len(p.refOps) > 0
}

// takeRefOps removes and returns up to limit queued reference operations, oldest first.
func (p *peer) takeRefOps(limit int) []wire.RefOp {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	n := min(limit, len(p.refOps))
	if n == 0 {
		return nil
	}
	ops := slices.Clone(p.refOps[:n])
	p.refOps = p.refOps[n:]
	if len(p.refOps) == 0 {
		p.refOps = nil
	}
	return ops
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
}

// connect returns the live stream to the peer, dialing it if there is none. Concurrent
// callers share one dial.
func (p *peer) connect(ctx context.Context) (*peerConn, error) {
	for {
		p.mu.Lock()
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
		if err == nil {
			p.conn = c
		}
		p.mu.Unlock()
		close(ch)
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
	c.writer.takeRefOps = p.takeRefOps
	self := p.agent.self
	if err := c.writer.sendFrame(wire.HelloFrame(self.Name, self.ID)); err != nil {
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
		if fr == nil {
			continue
		}
		if fr.Kind != wire.FrameResponse {
			msg.Release()
			a.log.Warn("tensorplay-rpc: unexpected frame from a callee; ignored", "worker", name, "kind", fr.Kind)
			continue
		}
		if refused != nil {
			// Only this call fails; its chunks are dropped as they come.
			if f := c.take(fr.ID); f != nil {
				f.complete(Message{}, fmt.Errorf("the reply of worker %q was refused: %w", name, refused))
			}
			continue
		}
		if f := c.take(fr.ID); f != nil {
			resp, err := responseResult(fr, msg, c.peer.info.Name)
			f.complete(resp, err)
		} else {
			msg.Release() // the caller gave up on it
		}
	}
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
	if p.agent.closing() {
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
}

// responseResult turns a response frame from worker, carrying msg, into the caller's result.
func responseResult(fr *wire.Frame, msg Message, worker string) (Message, error) {
	switch fr.Status {
	case wire.ReplyOK:
		return msg, nil
	case wire.ReplyNoHandler:
		return Message{}, fmt.Errorf("%w: worker %q: %s", ErrNoHandler, worker, fr.Error)
	case wire.ReplyTooLarge:
		return Message{}, fmt.Errorf("%w: worker %q: %s", ErrTooLarge, worker, fr.Error)
	default:
		return Message{}, &RemoteError{Worker: worker, Message: fr.Error, Payload: msg}
	}
}

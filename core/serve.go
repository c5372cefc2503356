package core

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// calleeDeadlineGrace is how much longer than the caller a callee lets a handler run.
const calleeDeadlineGrace = 50 * time.Millisecond

// serveStream serves the calls a peer makes over one stream.
func (a *Agent) serveStream(s transport.Stream) {
	caller := WorkerInfo{Name: "an unidentified peer"}
	defer func() {
		if r := recover(); r != nil {
			reportPanic(a.log, caller.Name, "serving a caller's stream", r, nil)
		}
	}()
	hello, err := s.Recv()
	if err != nil {
		if errors.Is(err, transport.ErrMalformed) {
			a.log.Warn("tensorplay-rpc: refused a stream that opened with what is not a frame", "worker", a.self.Name, "from", streamOrigin(s), "err", err)
		}
		return
	}
	select {
	case <-a.ready:
	case <-a.serveCtx.Done():
		return
	}
	if hello.Kind != wire.FrameHello {
		a.log.Warn("tensorplay-rpc: refused a stream that did not open with a hello", "worker", a.self.Name, "from", streamOrigin(s), "first_frame", hello.Kind)
		return
	}
	said, err := hello.Hello()
	if err != nil {
		a.log.Warn("tensorplay-rpc: refused a stream that opened with a bad hello", "worker", a.self.Name, "from", streamOrigin(s), "err", err)
		return
	}
	from := a.knownCaller(said)
	if from == nil {
		if a.dynamic {
			// A worker that left a moment ago, telling the world: nothing is amiss.
			a.log.Debug("tensorplay-rpc: refused a stream from a worker not in the world", "worker", a.self.Name, "from", said.Name)
			return
		}
		a.log.Warn("tensorplay-rpc: refused a stream from a caller not in the world", "worker", a.self.Name, "from", streamOrigin(s), "name", said.Name, "rank", said.Rank, "epoch", said.Epoch)
		return
	}
	if err := a.checkIdentity(s, from.info); err != nil {
		a.log.Warn("tensorplay-rpc: refused a stream: "+err.Error(), "worker", a.self.Name)
		return
	}
	caller = from.info
	// A caller whose stream ends may be gone; the RRef forks it held must not keep values.
	defer func() { go a.forgetIfGone(from) }()
	ctx, cancel := context.WithCancel(a.serveCtx)
	defer cancel()
	ss := &servedStream{agent: a, stream: s, from: from, ctx: ctx}
	ss.threadReadable, _ = s.(transport.SelfReading)
	ss.writer = newFrameWriter(s, a.chunkSize, func(error) { cancel() })
	defer ss.writer.close(ErrShutdown)
	defer a.lastServed.CompareAndSwap(ss, nil)
	incoming := newReassembler(ctx, a.maxMessageSize, a.receiveBudget, caller.Name)
	incoming.breakStream = func(err error) {
		a.log.Warn("tensorplay-rpc: dropped a caller's stream", "from", caller.Name, "err", err)
		cancel()
		s.Close()
	}
	incoming.attach(s)
	defer incoming.close()
	for {
		fr, err := s.Recv()
		var msg Message
		var refused error
		switch {
		case err == nil:
			fr, msg, refused, err = incoming.add(fr)
		case !errors.Is(err, transport.ErrMalformed):
			return // the stream ended: the caller closed it or left, or this worker shuts down
		}
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("tensorplay-rpc: dropped a caller that broke the protocol", "from", caller.Name, "err", err)
			}
			return
		}
		if fr != nil && !ss.handle(fr, msg, refused, incoming.hold, false) {
			return
		}
	}
}

// askForRefOpsAfter tells the caller its reference operations after number applied left a gap
// and were refused: it sends them all again (wire.RefsGap).
func (ss *servedStream) askForRefOpsAfter(applied uint64) {
	ss.writer.sendFrame(&wire.Frame{Kind: wire.FrameRefs, RefSeq: applied, Status: wire.RefsGap})
}

// servedStream is a caller's stream as this worker serves it: read by its reader goroutine
// (serveStream), and at times by an idle thread (ServeReading).
type servedStream struct {
	agent  *Agent
	stream transport.Stream
	from   *member
	ctx    context.Context // ends with the stream
	writer *frameWriter
	// threadReadable is the stream if threads may read it (ServeReading), else nil;
	// selfReader is set while one does (one at a time).
	threadReadable transport.SelfReading
	selfReader     atomic.Bool
}

// freeSlot gives back the caller's slot a call held (see handle).
func (ss *servedStream) freeSlot() { <-ss.from.served }

// reply queues a response and returns a channel closed once its memory is no longer read.
func (ss *servedStream) reply(fr *wire.Frame, msg Message) <-chan struct{} {
	a, from := ss.agent, ss.from
	if a.closing() {
		ss.freeSlot()
		return closedChan
	}
	// Every response acknowledges the caller's reference operations applied so far.
	fr.RefSeq = from.refsApplied.Load()
	from.stats.bytesSent.Add(int64(msg.Size()))
	out, err := ss.writer.send(fr, msg, ss.freeSlot)
	if err != nil {
		ss.freeSlot()
		a.log.Debug("tensorplay-rpc: reply not sent", "to", from.info.Name, "err", err)
		return closedChan
	}
	return out.sent
}

// handle serves one whole message from the caller; false means the stream must end. hold
// tells the reassembler the caller's silence meanwhile is this worker's doing (nil: there is
// none); slotHeld says the caller's slot for a request is taken already (a thread reading for
// itself takes it first, for it must not wait for one).
func (ss *servedStream) handle(fr *wire.Frame, msg Message, refused error, hold func() func(), slotHeld bool) bool {
	a, from, caller := ss.agent, ss.from, ss.from.info
	switch fr.Kind {
	case wire.FrameRequest:
		from.stats.callsServed.Add(1)
		from.stats.bytesReceived.Add(int64(msg.Size()))
		a.noteServed(ss)
		// Reference operations ride on requests, ahead of them (frameWriter.send): they
		// apply even to a request refused below.
		if len(fr.Refs) > 0 {
			if applied, gap := a.applyRefOpsFrom(from, fr.RefSeq, fr.Refs); gap {
				ss.askForRefOpsAfter(applied)
			}
		}
		if !slotHeld {
			// Each call being served holds one of its caller's slots (shared by all of its
			// streams) until its reply is sent; with none free the stream is not read, so
			// the caller's flow control, not this worker's memory, takes up the excess.
			unhold := func() {}
			if hold != nil {
				// While this worker holds the stream up, the silence is not the caller's:
				// the receive budget must not count it against it.
				unhold = hold()
			}
			defer unhold()
			select {
			case from.served <- struct{}{}:
			default:
				from.stats.waiting.Add(1)
				if r := a.lastServed.Load(); r != nil && r.from == from && r.selfReader.Load() {
					// A thread that reads a stream of this caller holds a slot while it
					// waits for a request: woken, it sees a call waiting for a slot
					// (ServeReading) and gives its own back.
					r.threadReadable.Interrupt()
				}
				select {
				case from.served <- struct{}{}:
					from.stats.waiting.Add(-1)
				case <-ss.ctx.Done():
					from.stats.waiting.Add(-1)
					msg.Release()
					return false
				}
			}
		}
		if refused != nil {
			ss.reply(&wire.Frame{Kind: wire.FrameResponse, ID: fr.ID, Status: wire.ReplyTooLarge, Error: fmt.Sprintf("the call to %q was refused: %v", a.self.Name, refused)}, Message{})
			return true
		}
		a.dispatch(ss.ctx, caller, fr, msg, ss.reply)
	case wire.FrameRefs:
		// They have no reply to ride on: the acknowledgement goes in a frame of its own.
		applied, gap := a.applyRefOpsFrom(from, fr.RefSeq, fr.Refs)
		if gap {
			ss.askForRefOpsAfter(applied)
		} else if applied > 0 {
			if err := ss.writer.sendFrame(&wire.Frame{Kind: wire.FrameRefs, RefSeq: applied}); err != nil {
				return false
			}
		}
	default:
		msg.Release()
		a.log.Warn("tensorplay-rpc: unexpected frame from a caller; ignored", "from", caller.Name, "kind", fr.Kind)
	}
	return true
}

// dispatch hands one request carrying msg to its handler; respond queues the response frame
// and returns a channel closed once the response's memory is no longer read.
func (a *Agent) dispatch(ctx context.Context, caller WorkerInfo, req *wire.Frame, msg Message, respond func(*wire.Frame, Message) <-chan struct{}) {
	id := req.ID
	h := a.handler(req.Method)
	if h == nil {
		msg.Release()
		respond(&wire.Frame{Kind: wire.FrameResponse, ID: id, Status: wire.ReplyNoHandler, Error: fmt.Sprintf("method %q is not registered", truncateText(req.Method, maxMethodName))}, Message{})
		return
	}
	cancel := context.CancelFunc(func() {})
	if req.TimeoutMs > 0 {
		// The grace lets the caller's own timer, not a reply to a give-up, decide the outcome.
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond+calleeDeadlineGrace)
	}
	call := &ServerCall{
		Caller:  caller,
		Method:  req.Method,
		Request: msg,
		ctx:     ctx,
		maxSize: a.maxMessageSize,
		log:     a.log,
		respond: func(resp *wire.Frame, m Message) <-chan struct{} {
			cancel()
			resp.ID = id
			return respond(resp, m)
		},
	}
	// A handler that panics fails its own call; the stream goes on serving.
	defer func() {
		if r := recover(); r != nil {
			reportPanic(a.log, caller.Name, "running the handler of "+truncateText(req.Method, maxMethodName), r, call.Fail)
		}
	}()
	h.ServeRPC(call)
}

package core

import (
	"context"
	"errors"
	"fmt"
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
	writer := newFrameWriter(s, a.chunkSize, func(error) { cancel() })
	defer writer.close(ErrShutdown)
	// Each call being served holds one of its caller's slots until its reply is sent; with
	// none free the stream is not read, so the caller's flow control, not this worker's
	// memory, takes up the excess.
	slots := from.served // shared by all of the caller's streams
	freeSlot := func() { <-slots }
	reply := func(fr *wire.Frame, msg Message) <-chan struct{} {
		if a.closing() {
			freeSlot()
			return closedChan
		}
		// Every response acknowledges the caller's reference operations applied so far.
		fr.RefSeq = from.refsApplied.Load()
		from.stats.bytesSent.Add(int64(msg.Size()))
		out, err := writer.send(fr, msg, freeSlot)
		if err != nil {
			freeSlot()
			a.log.Debug("tensorplay-rpc: reply not sent", "to", caller.Name, "err", err)
			return closedChan
		}
		return out.sent
	}
	incoming := newReassembler(ctx, a.maxMessageSize, a.receiveBudget, caller.Name)
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
		if fr == nil {
			continue
		}
		switch fr.Kind {
		case wire.FrameRequest:
			from.stats.callsServed.Add(1)
			from.stats.bytesReceived.Add(int64(msg.Size()))
			// Reference operations ride on requests, ahead of them (frameWriter.send): they
			// apply even to a request refused below.
			if len(fr.Refs) > 0 {
				a.applyRefOpsFrom(from, fr.RefSeq, fr.Refs)
			}
			// While this worker holds the stream up (no slot free, a handler pushing back), the
			// silence is not the caller's: the receive budget must not count it against it.
			unhold := incoming.hold()
			select {
			case slots <- struct{}{}:
			default:
				from.stats.waiting.Add(1)
				select {
				case slots <- struct{}{}:
					from.stats.waiting.Add(-1)
				case <-ctx.Done():
					from.stats.waiting.Add(-1)
					unhold()
					msg.Release()
					return
				}
			}
			if refused != nil {
				unhold()
				reply(&wire.Frame{Kind: wire.FrameResponse, ID: fr.ID, Status: wire.ReplyTooLarge, Error: fmt.Sprintf("the call to %q was refused: %v", a.self.Name, refused)}, Message{})
				continue
			}
			a.dispatch(ctx, caller, fr, msg, reply)
			unhold()
		case wire.FrameRefs:
			// They have no reply to ride on: the acknowledgement goes in a frame of its own.
			if applied := a.applyRefOpsFrom(from, fr.RefSeq, fr.Refs); applied > 0 {
				if err := writer.sendFrame(&wire.Frame{Kind: wire.FrameRefs, RefSeq: applied}); err != nil {
					return
				}
			}
		default:
			msg.Release()
			a.log.Warn("tensorplay-rpc: unexpected frame from a caller; ignored", "from", caller.Name, "kind", fr.Kind)
		}
	}
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

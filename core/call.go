package core

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// maxMethodName bounds a method name: names are short, and a request's head must fit a frame.
const maxMethodName = 1024

// Call runs method on worker to and waits for its reply, at most until ctx is done.
func (a *Agent) Call(ctx context.Context, to, method string, req Message) (Message, error) {
	return a.CallAsync(ctx, to, method, req).Result()
}

// CallAsync starts a call of method on worker to and returns at once. The call fails with
// ErrTimeout when ctx's deadline passes, ErrCanceled when ctx is canceled, ErrPeerLost when the
// stream to the worker breaks, and a *RemoteError when the handler fails.
func (a *Agent) CallAsync(ctx context.Context, to, method string, req Message) *CallFuture {
	f := newCallFuture()
	m := a.world().byName[to]
	if m == nil {
		f.complete(Message{}, fmt.Errorf("%w: %q is not a worker of this world", ErrUnknownWorker, to))
		return f
	}
	return a.call(ctx, m, method, req, f)
}

// CallRank is CallAsync with the destination given by its rank (worker id).
func (a *Agent) CallRank(ctx context.Context, to int, method string, req Message) *CallFuture {
	f := newCallFuture()
	m, err := a.member(to)
	if err != nil {
		f.complete(Message{}, err)
		return f
	}
	return a.call(ctx, m, method, req, f)
}

// WouldRefuse is the error a call of method on worker to, carrying size bytes, would be refused
// with before any of it is sent, or nil: a caller can learn it before it registers what the
// call carries (RRef forks).
func (a *Agent) WouldRefuse(to int, method string, size int64) error {
	m, err := a.member(to)
	if err != nil {
		return err
	}
	return a.refusal(m.info.Name, method, size)
}

// refusal is why a call would be refused before any of it is sent, or nil.
func (a *Agent) refusal(name, method string, size int64) error {
	switch {
	case a.state.Load() == stateClosed:
		return fmt.Errorf("%w: cannot call worker %q", ErrShutdown, name)
	case len(method) > maxMethodName:
		return fmt.Errorf("the method name for worker %q is %d bytes long, more than %d", name, len(method), maxMethodName)
	case size > a.maxMessageSize:
		return fmt.Errorf("%w: the call to worker %q carries %d bytes, over the %d-byte limit; nothing was sent", ErrTooLarge, name, size, a.maxMessageSize)
	}
	return nil
}

func (a *Agent) call(ctx context.Context, to *member, method string, req Message, f *CallFuture) *CallFuture {
	name := to.info.Name
	if err := ctx.Err(); err != nil {
		return f.refuse(a.contextError(ctx, name))
	}
	if err := a.refusal(name, method, int64(req.Size())); err != nil {
		return f.refuse(err)
	}
	a.outstanding.Add(1)
	a.started.Add(1)
	id := a.nextID.Add(1)
	frame := &wire.Frame{Kind: wire.FrameRequest, ID: id, Method: method}
	if dl, ok := ctx.Deadline(); ok {
		frame.TimeoutMs = max(1, time.Until(dl).Milliseconds())
	}

	// The deadline watcher may fire before the call is sent or while it is pending: it takes
	// the call out of whichever stream table holds it and fails it.
	var stopWatch atomic.Pointer[func() bool]
	to.stats.callStarted(req)
	started := time.Now()
	f.onDone = func() {
		a.outstanding.Add(-1)
		to.stats.callDone(started, f.resp, f.err)
		if stop := stopWatch.Load(); stop != nil {
			(*stop)()
		}
	}
	stop := context.AfterFunc(ctx, func() {
		if c := f.conn.Load(); c != nil {
			c.take(id)
		}
		f.complete(Message{}, a.contextError(ctx, name))
		f.abortSend()
	})
	stopWatch.Store(&stop)
	if to.info.ID == a.self.ID {
		// Both ways an own copy (Message.ownCopy), so the request's and the reply's memory are
		// no longer read once the call returns and the reply is handed over.
		to.stats.callsServed.Add(1)
		to.stats.bytesReceived.Add(int64(req.Size()))
		// A shutdown fails it if it is still pending then, as it fails calls to peers (a handler
		// queued to Python may never run).
		stopOnClose := context.AfterFunc(a.serveCtx, func() {
			f.complete(Message{}, fmt.Errorf("%w: the call to worker %q (itself) was still pending", ErrShutdown, a.self.Name))
		})
		f.AfterDone(func() { stopOnClose() })
		a.dispatch(a.serveCtx, a.self, frame, req.ownCopy(), func(resp *wire.Frame, msg Message) <-chan struct{} {
			to.stats.bytesSent.Add(int64(msg.Size()))
			own := msg.ownCopy()
			reply, err := responseResult(resp, own, name)
			if !f.complete(reply, err) {
				own.Release()
			}
			return closedChan
		})
		return f
	}
	c, err := to.peer.connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			err = a.contextError(ctx, name)
		}
		f.complete(Message{}, err)
		return f
	}
	f.conn.Store(c)
	if err := c.send(id, f, frame, req); err != nil {
		f.complete(Message{}, err)
	}
	select {
	case <-f.done: // the watcher may have fired before conn was set: drop the entry
		c.take(id)
	default:
	}
	return f
}

// contextError explains why ctx ended a call to worker.
func (a *Agent) contextError(ctx context.Context, worker string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: the call to worker %q ran past its deadline", ErrTimeout, worker)
	}
	return fmt.Errorf("%w: the call to worker %q was canceled", ErrCanceled, worker)
}

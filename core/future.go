package core

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// CallFuture is the pending result of one call.
type CallFuture struct {
	done chan struct{}
	once sync.Once
	resp Message
	err  error
	// onDone runs once when the call completes, before Done is closed.
	onDone func()

	outMu     sync.Mutex
	writer    *frameWriter
	out       *outMessage // the request, while it is sent in chunks
	afterDone []func()

	// conn is the stream the request went on, once it did. completed is set once Done is
	// closed, and then interrupt, if set, wakes the thread reading for itself (AwaitReading):
	// both atomics, so that thread, which sets interrupt and then looks at completed, and the
	// completer, which does the opposite, cannot both miss the other.
	conn      atomic.Pointer[peerConn]
	completed atomic.Bool
	interrupt atomic.Pointer[func()]
	refused   atomic.Bool // failed before any of it was sent (refuse)
}

func newCallFuture() *CallFuture { return &CallFuture{done: make(chan struct{})} }

func (f *CallFuture) setOutgoing(w *frameWriter, out *outMessage) {
	f.outMu.Lock()
	f.writer, f.out = w, out
	f.outMu.Unlock()
	select {
	case <-f.done: // completed (timed out) before the request was queued
		w.abort(out)
	default:
	}
}

// Sent is closed once the request's memory is no longer read: after it was sent, or after an
// early failure stopped its sending. Until then the caller must keep it unchanged.
func (f *CallFuture) Sent() <-chan struct{} {
	f.outMu.Lock()
	defer f.outMu.Unlock()
	if f.out == nil {
		return closedChan
	}
	return f.out.sent
}

// abortSend stops sending the request of a call that failed early.
func (f *CallFuture) abortSend() {
	f.outMu.Lock()
	w, out := f.writer, f.out
	f.outMu.Unlock()
	if out != nil {
		w.abort(out)
	}
}

// refuse fails a call before any of it was sent (Refused) and returns it.
func (f *CallFuture) refuse(err error) *CallFuture {
	if f.complete(Message{}, err) {
		f.refused.Store(true)
	}
	return f
}

// Refused reports whether the call failed before any of it was sent: its callee never heard of
// it (the caller may take back what it registered for it, as RRef forks: Agent.RetractFork).
func (f *CallFuture) Refused() bool { return f.refused.Load() }

// complete sets the outcome once; it reports whether this call set it.
func (f *CallFuture) complete(resp Message, err error) bool {
	set := false
	f.once.Do(func() {
		f.resp, f.err = resp, err
		if f.onDone != nil {
			f.onDone()
		}
		f.outMu.Lock()
		close(f.done)
		after := f.afterDone
		f.afterDone = nil
		f.outMu.Unlock()
		// After Done is closed: a thread that sees completed finds it closed.
		f.completed.Store(true)
		if wake := f.interrupt.Load(); wake != nil {
			(*wake)()
		}
		for _, fn := range after {
			fn()
		}
		set = true
	})
	return set
}

// Discard says the caller will not read the reply: once the call completes, the reply's memory
// goes back (a big reply may live in shared memory its sender reuses only once it is
// released). Result must not be used afterwards.
func (f *CallFuture) Discard() {
	f.AfterDone(func() {
		f.resp.Release()
		var re *RemoteError
		if errors.As(f.err, &re) {
			re.Payload.Release()
		}
	})
}

// AfterDone runs fn once the call has completed: at once if it has, else on the goroutine
// that completes it, so fn must not block.
func (f *CallFuture) AfterDone(fn func()) {
	f.outMu.Lock()
	select {
	case <-f.done:
		f.outMu.Unlock()
		fn()
		return
	default:
	}
	f.afterDone = append(f.afterDone, fn)
	f.outMu.Unlock()
}

// AwaitReading waits up to d for the call to complete, reading the stream to the callee itself
// while it can (transport.SelfReading): the reply then wakes this thread directly, not through
// the stream's reader goroutine. It returns what is left of d: at once, all of it, where it
// cannot read (another thread does, or the transport cannot); the caller then waits otherwise.
func (f *CallFuture) AwaitReading(d time.Duration) time.Duration {
	deadline := time.Now().Add(d)
	c := f.conn.Load()
	if c == nil || f.completed.Load() {
		return d
	}
	sr, ok := c.stream.(transport.SelfReading)
	if !ok || !c.selfReader.CompareAndSwap(false, true) {
		return d
	}
	defer c.selfReader.Store(false)
	defer func() {
		if r := recover(); r != nil {
			reportPanic(c.peer.agent.log, c.peer.info.Name, "reading replies", r, c.fail)
		}
	}()
	wake := sr.Interrupt
	handle := func(fr *wire.Frame) {
		// A small frame (transport.SelfReading): the whole message, no reassembly.
		c.peer.agent.selfReadFrames.Add(1)
		c.deliver(fr, Message{Payload: fr.Payload, Buffers: fr.Buffers, release: fr.TakeRecycle()}, nil)
	}
	for !f.completed.Load() {
		left := time.Until(deadline)
		if left <= 0 {
			return 0
		}
		// Set only while this thread may sleep: one that completes its own call wakes nobody.
		f.interrupt.Store(&wake)
		_, err := sr.RecvWaiting(left, f.completed.Load, handle)
		f.interrupt.Store(nil)
		switch {
		case errors.Is(err, transport.ErrBusy):
			return time.Until(deadline)
		case err != nil:
			c.fail(err)
			return time.Until(deadline)
		}
	}
	return time.Until(deadline)
}

// Done is closed when the call has completed.
func (f *CallFuture) Done() <-chan struct{} { return f.done }

// Result waits for the call and returns its reply or error.
func (f *CallFuture) Result() (Message, error) {
	<-f.done
	return f.resp, f.err
}

// Wait is Result bounded by ctx; it does not cancel the call.
func (f *CallFuture) Wait(ctx context.Context) (Message, error) {
	select {
	case <-f.done:
		return f.resp, f.err
	case <-ctx.Done():
		return Message{}, ctx.Err()
	}
}

package core

import (
	"context"
	"sync"
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
		for _, fn := range after {
			fn()
		}
		set = true
	})
	return set
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

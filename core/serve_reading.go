package core

import (
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// ServeReading waits up to d, until stop reports true, reading for itself the stream of the
// caller served last where it can (transport.SelfReading): a request then wakes this thread
// directly, not the stream's reader goroutine, and it serves what it reads as that goroutine
// would, handlers included (so a handler must not block, as Handler says). A handler that
// queues the request for the thread that is to run it, as pybind's does, so hands it to this
// one without a wake-up. Until it returns, wake holds what wakes the thread; stop must
// report true once that ran. It returns what is left of d:
// all of it, at once, where it cannot read (no such stream, another thread reads it, the
// caller has no slot free), and the caller then waits otherwise.
func (a *Agent) ServeReading(d time.Duration, stop func() bool, wake *atomic.Pointer[func()]) time.Duration {
	deadline := time.Now().Add(d)
	ss := a.lastServed.Load()
	if ss == nil || stop() || !ss.selfReader.CompareAndSwap(false, true) {
		return d
	}
	defer ss.selfReader.Store(false)
	var slotHeld bool // a caller slot taken for a request not yet dispatched
	defer func() {
		if r := recover(); r != nil {
			if slotHeld { // a panic before the request's dispatch, which frees it once served
				ss.freeSlot()
			}
			reportPanic(a.log, ss.from.info.Name, "serving a caller's stream", r, func(error) { ss.stream.Close() })
		}
	}()
	sr := ss.threadReadable
	interrupt, awake := sr.Interrupt, func() {}
	serve := func(fr *wire.Frame) {
		a.selfReadFrames.Add(1)
		request := fr.Kind == wire.FrameRequest
		// Awake while it serves: what wakes it then (the handler's, perhaps) rings nothing.
		wake.Store(&awake)
		ss.handle(fr, Message{Payload: fr.Payload, Buffers: fr.Buffers, release: fr.TakeRecycle()}, nil, nil, slotHeld && request)
		wake.Store(&interrupt)
		slotHeld = slotHeld && !request
	}
	// A call of this caller waiting for a slot (the reader goroutine of one of its streams
	// holds it) has this thread give back the slot it holds for the request it waits for.
	stopOrGiveBack := func() bool { return stop() || ss.from.stats.waiting.Load() > 0 }
	wake.Store(&interrupt)
	defer wake.Store(nil)
	for !stop() {
		left := time.Until(deadline)
		if left <= 0 {
			return 0
		}
		// The caller's slot for the request first: with a frame in hand, this thread must
		// not wait for one (the threads that free slots may include this one). A call
		// waiting for one gets the next freed first (it waits in a send on the channel).
		select {
		case ss.from.served <- struct{}{}:
			slotHeld = true
		default:
			return left
		}
		_, err := sr.RecvWaiting(left, stopOrGiveBack, serve)
		if slotHeld {
			ss.freeSlot()
			slotHeld = false
		}
		if err != nil { // another reads it, or it broke: its reader goroutine hears of that
			break
		}
	}
	return time.Until(deadline)
}

// noteServed makes ss the stream threads read (ServeReading) once it served a request.
func (a *Agent) noteServed(ss *servedStream) {
	if ss.threadReadable != nil && a.lastServed.Load() != ss {
		a.lastServed.Store(ss)
	}
}

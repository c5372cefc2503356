package pybind

import "github.com/tensorplay/tensorplay-rpc/core/wire"

// Event kinds.
const (
	EventCallDone = iota + 1
	EventRRefsDropped
	// EventLogs says Go logged records for Python (TakeLogs).
	EventLogs
)

// Event is something Python must act on: a call Python asked to be told about completed, or
// RRefs this worker owns are referenced nowhere any more.
type Event struct {
	kind     int
	notifyID int64
	rrefs    []wire.RRefID
}

// post queues an event without blocking the goroutine that found it.
func (a *Agent) post(e *Event) { a.events.put(e) }

// NextEvent waits up to timeoutMs for the next event (none once the agent is shut down and
// none is queued) and says what it is in one boundary call, as a completion comes for every
// call with callbacks: a completed call's notifyID (positive); minus its kind for the others,
// whose detail TakenEvent gives; 0 for none. handled says the thread acted on the event it
// took last.
func (a *Agent) NextEvent(timeoutMs int, handled bool) int64 {
	e := a.events.take(timeoutMs, handled)
	switch {
	case e == nil:
		return 0
	case e.kind == EventCallDone:
		return e.notifyID
	default:
		a.takenEvent.Store(e)
		return -int64(e.kind)
	}
}

// TakenEvent is the last event NextEvent gave that was not a completed call (one thread
// takes the events).
func (a *Agent) TakenEvent() *Event { return a.takenEvent.Load() }

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

// Valid reports whether the event is real (gopy turns a nil *Event into an empty one).
func (e *Event) Valid() bool { return e != nil && e.kind != 0 }

// Kind is EventCallDone or EventRRefsDropped.
func (e *Event) Kind() int { return e.kind }

// NotifyID is the notifyID of the completed call.
func (e *Event) NotifyID() int64 { return e.notifyID }

// post queues an event without blocking the goroutine that found it.
func (a *Agent) post(e *Event) { a.events.put(e) }

// NextEvent returns the next event, or nil if none came within timeoutMs or the agent is
// shut down and no event is queued. handled says the thread acted on the event it took last.
func (a *Agent) NextEvent(timeoutMs int, handled bool) *Event {
	return a.events.take(timeoutMs, handled)
}

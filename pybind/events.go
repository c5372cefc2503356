package pybind

import (
	"context"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// Event kinds.
const (
	EventCallDone = iota + 1
	EventRRefDropped
)

// Event is something Python must act on: a call made with a notifyID completed, or an RRef
// this worker owns is referenced nowhere any more.
type Event struct {
	kind     int
	notifyID int64
	rref     wire.RRefID
}

// Valid reports whether the event is real (gopy turns a nil *Event into an empty one).
func (e *Event) Valid() bool { return e != nil && e.kind != 0 }

// Kind is EventCallDone or EventRRefDropped.
func (e *Event) Kind() int { return e.kind }

// NotifyID is the notifyID of the completed call.
func (e *Event) NotifyID() int64 { return e.notifyID }

// RRefCreator and RRefLocal are the id of the dropped RRef.
func (e *Event) RRefCreator() int { return e.rref.Creator }

// RRefLocal: see RRefCreator.
func (e *Event) RRefLocal() int64 { return e.rref.Local }

// post queues an event without blocking the goroutine that found it.
func (a *Agent) post(e *Event) {
	select {
	case a.events <- e:
	default:
		go func() { a.events <- e }()
	}
}

// NextEvent returns the next event, or nil if none came within timeoutMs or the agent is
// shut down and no event is queued.
func (a *Agent) NextEvent(timeoutMs int) *Event {
	return receive(a.events, timeoutMs, a.shutdownDone)
}

// NewLocalID returns a number no other RRef or fork id made by this worker has; with this
// worker's id it names an RRef or a fork.
func (a *Agent) NewLocalID() int64 { return a.agent.NewRRefID().Local }

// AddFork registers a fork of an RRef with its owner before the message carrying it is sent
// (see core.Agent.AddFork).
func (a *Agent) AddFork(owner, rrefCreator int, rrefLocal int64, forkCreator int, forkLocal int64, holder int) (err error) {
	defer recovered(&err)
	return a.agent.AddFork(context.Background(), owner,
		wire.RRefID{Creator: rrefCreator, Local: rrefLocal}, wire.ForkID{Creator: forkCreator, Local: forkLocal}, holder)
}

// ReleaseFork tells the owner this worker dropped a fork; it does not block.
func (a *Agent) ReleaseFork(owner, rrefCreator int, rrefLocal int64, forkCreator int, forkLocal int64) (err error) {
	defer recovered(&err)
	return a.agent.ReleaseFork(owner, wire.RRefID{Creator: rrefCreator, Local: rrefLocal}, wire.ForkID{Creator: forkCreator, Local: forkLocal})
}

// OwnedRRefs is the number of RRefs this worker owns that are referenced somewhere.
func (a *Agent) OwnedRRefs() int { return a.agent.OwnedRRefs() }

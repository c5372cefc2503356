package pybind

import (
	"context"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// RRef bookkeeping: the core keeps the reference counts and the fork protocol; Python keeps
// the owned values and drops those an EventRRefsDropped event names.

// dropDelay is how long RRefs referenced nowhere wait to be dropped together: dropping wakes
// the event thread, which then competes for the GIL with the threads serving calls, and a
// loop of remote() calls would wake it once per RRef.
const dropDelay = 5 * time.Millisecond

// rrefDropped queues id for Python to drop.
func (a *Agent) rrefDropped(id wire.RRefID) {
	a.dropMu.Lock()
	a.dropped = append(a.dropped, id)
	arm := len(a.dropped) == 1
	a.dropMu.Unlock()
	if arm {
		time.AfterFunc(dropDelay, a.postDropped)
	}
}

func (a *Agent) postDropped() {
	a.dropMu.Lock()
	ids := a.dropped
	a.dropped = nil
	a.dropMu.Unlock()
	a.post(&Event{kind: EventRRefsDropped, rrefs: ids})
}

// Dropped is the number of RRefs the event names.
func (e *Event) Dropped() int { return len(e.rrefs) }

// RRefCreator and RRefLocal are the id of the event's i-th RRef.
func (e *Event) RRefCreator(i int) int { return e.rrefs[i].Creator }

// RRefLocal: see RRefCreator.
func (e *Event) RRefLocal(i int) int64 { return e.rrefs[i].Local }

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

// RetractFork takes back a fork's registration for a message that was never sent, if it has not
// gone to the owner yet (core.Agent.RetractFork); it reports whether it did.
func (a *Agent) RetractFork(owner, rrefCreator int, rrefLocal int64, forkCreator int, forkLocal int64, holder int) (retracted bool) {
	defer func() {
		if recover() != nil {
			retracted = false
		}
	}()
	return a.agent.RetractFork(owner, wire.RRefID{Creator: rrefCreator, Local: rrefLocal}, wire.ForkID{Creator: forkCreator, Local: forkLocal}, holder)
}

// ReleaseFork tells the owner this worker dropped a fork; it does not block.
func (a *Agent) ReleaseFork(owner, rrefCreator int, rrefLocal int64, forkCreator int, forkLocal int64) (err error) {
	defer recovered(&err)
	return a.agent.ReleaseFork(owner, wire.RRefID{Creator: rrefCreator, Local: rrefLocal}, wire.ForkID{Creator: forkCreator, Local: forkLocal})
}

// OwnedRRefs is the number of RRefs this worker owns that are referenced somewhere.
func (a *Agent) OwnedRRefs() int { return a.agent.OwnedRRefs() }

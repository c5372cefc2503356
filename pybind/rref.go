package pybind

import (
	"context"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// RRef bookkeeping: the core keeps the reference counts and the fork protocol; Python keeps
// the owned values and drops one when an EventRRefDropped event names it.

// RRefCreator and RRefLocal are the id of the dropped RRef.
func (e *Event) RRefCreator() int { return e.rref.Creator }

// RRefLocal: see RRefCreator.
func (e *Event) RRefLocal() int64 { return e.rref.Local }

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

package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// The protocol keeps one invariant: a fork's wire.RefAdd reaches the owner before its parent's
// wire.RefRelease does. A worker sends the wire.RefAdd of every fork it hands out (including the first
// one, for remote()) on its own stream to the owner, before the message that carries the
// fork, and it can only release its own fork later, on the same ordered stream. A wire.RefRelease
// may still overtake the wire.RefAdd of the same fork (the receiver drops it at once, on its own
// stream); the owner then keeps it as a tombstone until the wire.RefAdd comes. So a value whose
// table entry has no live forks and no tombstones is referenced nowhere and can be dropped.

// refTable is the owner's side: the live forks of every RRef it owns.
type refTable struct {
	mu      sync.Mutex
	entries map[wire.RRefID]*refEntry
}

type refEntry struct {
	forks      map[wire.ForkID]holderRef // fork → holder
	tombstones map[wire.ForkID]holderRef // fork released before it was added → the holder that released it
}

// holderRef is the member holding a fork: a worker's id and epoch (see wire.RefOp).
type holderRef struct {
	id    int
	epoch uint64
}

func newRefTable() *refTable { return &refTable{entries: map[wire.RRefID]*refEntry{}} }

// hasForks reports whether some fork of id is registered.
func (t *refTable) hasForks(id wire.RRefID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	return e != nil && len(e.forks) > 0
}

// apply performs op and reports whether the RRef is now referenced nowhere.
func (t *refTable) apply(op wire.RefOp) (dropped bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[op.RRef]
	if e == nil {
		e = &refEntry{forks: map[wire.ForkID]holderRef{}, tombstones: map[wire.ForkID]holderRef{}}
		t.entries[op.RRef] = e
	}
	by := holderRef{op.Holder, op.HolderEpoch}
	// Only a fork's holder can release it, and nothing rewrites a fork or tombstone already
	// there: forged operations can at worst keep a value alive, never free it early.
	switch op.Kind {
	case wire.RefAdd:
		if releasedBy, early := e.tombstones[op.Fork]; early && releasedBy == by {
			delete(e.tombstones, op.Fork)
		} else if _, dup := e.forks[op.Fork]; !dup {
			e.forks[op.Fork] = by
		}
	case wire.RefRelease:
		if holder, ok := e.forks[op.Fork]; ok {
			if holder == by {
				delete(e.forks, op.Fork)
			}
		} else if _, dup := e.tombstones[op.Fork]; !dup {
			e.tombstones[op.Fork] = by
		}
	}
	if len(e.forks) == 0 && len(e.tombstones) == 0 {
		delete(t.entries, op.RRef)
		return true
	}
	return false
}

// releaseHolder drops every fork held by the member of id worker that joined at epoch, as when
// it is gone, and the tombstones waiting for a registration only it could send (a fork's
// creator registers it, and a member's ids count from its epoch: see joinDynamic), and
// returns the RRefs that are now referenced nowhere.
func (t *refTable) releaseHolder(worker int, epoch uint64) []wire.RRefID {
	t.mu.Lock()
	defer t.mu.Unlock()
	gone := holderRef{worker, epoch}
	var dropped []wire.RRefID
	for id, e := range t.entries {
		for fork, holder := range e.forks {
			if holder == gone {
				delete(e.forks, fork)
			}
		}
		for fork := range e.tombstones {
			if fork.Creator == worker && uint64(fork.Local)>>32 == epoch {
				delete(e.tombstones, fork)
			}
		}
		if len(e.forks) == 0 && len(e.tombstones) == 0 {
			delete(t.entries, id)
			dropped = append(dropped, id)
		}
	}
	return dropped
}

func (t *refTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// NewRRefID returns an id no other RRef or fork of the world has.
func (a *Agent) NewRRefID() wire.RRefID {
	return wire.RRefID{Creator: a.self.ID, Local: a.nextLocalID.Add(1)}
}

// AddFork registers fork of rref, held by holder, with the RRef's owner. Call it before
// sending the message that carries the fork: the registration travels with the next frame
// this worker sends the owner (the message itself, when it goes to the owner) or goes on its
// own within refFlushDelay, in order with every other reference operation for that owner.
func (a *Agent) AddFork(ctx context.Context, owner int, rref wire.RRefID, fork wire.ForkID, holder int) error {
	h, err := a.member(holder)
	if err != nil {
		return fmt.Errorf("the RRef fork's holder: %w", err)
	}
	op := wire.RefOp{Kind: wire.RefAdd, RRef: rref, Fork: fork, Holder: holder, HolderEpoch: h.epoch}
	if owner == a.self.ID {
		a.applyRefOps([]wire.RefOp{op})
		return nil
	}
	m, err := a.member(owner)
	if err != nil {
		return fmt.Errorf("the RRef's owner: %w", err)
	}
	if a.state.Load() == stateClosed {
		return fmt.Errorf("%w: cannot register an RRef fork with worker %q", ErrShutdown, m.info.Name)
	}
	a.queueRefOp(m, op)
	return ctx.Err()
}

// RetractFork takes back the registration AddFork queued of fork, held by holder, for a message
// that was never sent (refused before it left): that holder will never hear of the fork, so
// never release it. It reports whether it did, which it can while the registration still waits
// to be sent (it rides on the next frame to the owner or goes within refFlushDelay), or when
// this worker is the owner.
func (a *Agent) RetractFork(owner int, rref wire.RRefID, fork wire.ForkID, holder int) bool {
	h, err := a.member(holder)
	if err != nil {
		return false
	}
	if owner == a.self.ID {
		a.applyRefOps([]wire.RefOp{{Kind: wire.RefRelease, RRef: rref, Fork: fork, Holder: holder, HolderEpoch: h.epoch}})
		return true
	}
	m, err := a.member(owner)
	if err != nil {
		return false
	}
	return m.peer.retractRefAdd(wire.RefOp{Kind: wire.RefAdd, RRef: rref, Fork: fork, Holder: holder, HolderEpoch: h.epoch})
}

// ReleaseFork tells the RRef's owner that this worker dropped fork. It does not block: the
// release travels like AddFork's registrations, after any made before.
func (a *Agent) ReleaseFork(owner int, rref wire.RRefID, fork wire.ForkID) error {
	op := wire.RefOp{Kind: wire.RefRelease, RRef: rref, Fork: fork, Holder: a.self.ID, HolderEpoch: a.epoch}
	if owner == a.self.ID {
		a.applyRefOps([]wire.RefOp{op})
		return nil
	}
	m, err := a.member(owner)
	if errors.Is(err, ErrWorkerLeft) {
		return nil // its values went with it
	}
	if err != nil {
		return fmt.Errorf("the RRef's owner: %w", err)
	}
	a.queueRefOp(m, op)
	return nil
}

// refFlushDelay is how long reference operations wait for a frame to the owner to ride on
// before they go in a frame of their own: a remote() takes its fork's registration along,
// and a loop of remote() calls takes the previous RRef's release, with no frame and no
// wake-up of the owner's reader for either.
const refFlushDelay = 2 * time.Millisecond

func (a *Agent) queueRefOp(owner *member, op wire.RefOp) {
	owner.peer.queueRefOp(op)
	a.queueRefFlush()
}

// queueRefFlush has the reference operations queued go out soon, if no frame takes them. A
// timer, not a goroutine woken at once: most operations are gone before it fires.
func (a *Agent) queueRefFlush() {
	if a.refFlushArmed.CompareAndSwap(false, true) {
		time.AfterFunc(refFlushDelay, a.flushLateRefOps)
	}
}

// flushLateRefOps sends the reference operations no frame took along.
func (a *Agent) flushLateRefOps() {
	a.refFlushArmed.Store(false)
	if a.serveCtx.Err() == nil {
		a.flushRefOps(a.serveCtx)
	}
}

// OwnedRRefs is the number of RRefs this worker owns that are still referenced somewhere.
func (a *Agent) OwnedRRefs() int { return a.refs.len() }

// applyRefOpsFrom applies reference operations that worker sent to this one as owner, the
// first numbered first (wire.Frame.RefSeq), and returns the number of the last one applied
// from worker, and whether it refused them for a gap before them. Each number is applied once,
// in order: an operation sent again on a new stream after the old one broke is skipped, and a
// batch that would leave a gap is refused (the sender, told so, sends again everything after
// the last applied). A worker can only release its own forks:
// releases naming another holder are refused.
func (a *Agent) applyRefOpsFrom(from *member, first uint64, ops []wire.RefOp) (applied uint64, gap bool) {
	a.refSeqMu.Lock()
	defer a.refSeqMu.Unlock()
	worker := from.info
	applied = from.refsApplied.Load()
	if len(ops) == 0 {
		return applied, false
	}
	if first == 0 || first > applied+1 {
		// The sender is told (wire.RefsGap) and sends again from applied+1.
		a.log.Warn("tensorplay-rpc: refused RRef operations out of sequence; asked for them again", "from", worker.Name, "first", first, "applied", applied)
		return applied, true
	}
	if skip := applied + 1 - first; skip < uint64(len(ops)) {
		ops = ops[skip:]
	} else {
		return applied, false
	}
	valid := make([]wire.RefOp, 0, len(ops))
	refused := 0
	w := a.world()
	for _, op := range ops {
		holder := w.byID[op.Holder]
		switch {
		case op.Kind == wire.RefAdd && holder != nil && holder.epoch == op.HolderEpoch,
			// A member that joined after this worker's view: it will hear of it.
			op.Kind == wire.RefAdd && a.dynamic && op.HolderEpoch > w.version,
			op.Kind == wire.RefRelease && op.Holder == worker.ID && op.HolderEpoch == from.epoch:
			valid = append(valid, op)
		default:
			refused++
		}
	}
	if refused > 0 {
		a.log.Warn("tensorplay-rpc: refused RRef operations a worker may not make (releases of another's forks, unknown holders or kinds)", "from", worker.Name, "count", refused)
	}
	a.applyRefOps(valid)
	applied += uint64(len(ops))
	from.refsApplied.Store(applied)
	return applied, false
}

// applyRefOps applies reference operations addressed to this worker as owner.
func (a *Agent) applyRefOps(ops []wire.RefOp) {
	for _, op := range ops {
		if a.refs.apply(op) {
			a.rrefDropped(op.RRef)
		}
	}
}

// flushRefOps sends every queued reference operation. Those for an owner that cannot be reached
// now stay queued, to go with the next stream to it (a retry comes after refRetryDelay): the
// owner is still in the world (one that left has its operations dropped with it, peer.leave),
// and dropping them would leave its sequence behind the holder's for good.
func (a *Agent) flushRefOps(ctx context.Context) {
	undelivered := false
	for _, m := range a.world().byID {
		p := m.peer
		if !p.hasRefOps() {
			continue
		}
		c, err := p.connect(ctx)
		if err == nil {
			err = c.writer.sendRefOps()
		}
		if err != nil {
			undelivered = true
			a.log.Debug("tensorplay-rpc: RRef operations not delivered yet", "owner", p.info.Name, "err", err)
		}
	}
	if undelivered && a.serveCtx.Err() == nil && a.refRetryArmed.CompareAndSwap(false, true) {
		time.AfterFunc(refRetryDelay, func() {
			a.refRetryArmed.Store(false)
			a.flushLateRefOps()
		})
	}
}

// refRetryDelay is how long reference operations an owner could not be sent wait before the
// next try, when no call to it takes them along sooner.
const refRetryDelay = 500 * time.Millisecond

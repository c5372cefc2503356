package core

import (
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// SetReceiveIdleLimit changes how long a stream holding receive budget may stall before it is
// evicted (idleReservationLimit), for tests about memory rather than eviction: on a loaded
// 2-core machine running -race binaries side by side, an honest sender can go 2 s without
// being scheduled.
func (a *Agent) SetReceiveIdleLimit(d time.Duration) {
	a.receiveBudget.mu.Lock()
	defer a.receiveBudget.mu.Unlock()
	a.receiveBudget.idleLimit = d
}

// ShuttingDown reports whether Shutdown of a has begun: a graceful one is in its barrier (or
// waiting for a's own calls before it), or a is closed.
func (a *Agent) ShuttingDown() bool { return a.state.Load() != stateRunning }

// SelfReadFrames is how many frames threads waiting for their replies read themselves.
func (a *Agent) SelfReadFrames() int64 { return a.selfReadFrames.Load() }

// ReleaseForkLostInFlight is ReleaseFork whose operation goes out on the current stream and is
// lost on the way (as if a frame carrying it vanished): the owner sees a gap after it.
func (a *Agent) ReleaseForkLostInFlight(owner int, rref wire.RRefID, fork wire.ForkID) {
	m, err := a.member(owner)
	if err != nil {
		panic(err)
	}
	p := m.peer
	p.refMu.Lock()
	defer p.refMu.Unlock()
	p.refLog = append(p.refLog, wire.RefOp{Kind: wire.RefRelease, RRef: rref, Fork: fork, Holder: a.self.ID, HolderEpoch: a.epoch})
	p.refSent = len(p.refLog)
}

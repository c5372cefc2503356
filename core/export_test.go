package core

import "time"

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

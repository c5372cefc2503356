package core

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// closing reports whether shutdown has begun closing the agent.
func (a *Agent) closing() bool { return a.state.Load() == stateClosed }

// Shutdown leaves the world. Graceful shutdown is a barrier: it waits until this worker's own
// calls have completed and every other worker has called Shutdown too, and repeats until no
// worker made a call since the last round, so no worker stops while others still call it; ctx
// bounds the wait. Non-graceful shutdown closes at once and
// fails pending calls with ErrShutdown. Only the first call does anything.
func (a *Agent) Shutdown(ctx context.Context, graceful bool) error {
	err := ErrShutdown
	a.shutdown.Do(func() {
		err = nil
		switch {
		case a.dynamic:
			err = a.leave(ctx, graceful)
		case graceful:
			var rounds int
			if rounds, err = a.drain(ctx); err == nil {
				err = a.beforeClosing(ctx, rounds)
			}
		}
		a.close()
	})
	return err
}

// SetBeforeClose sets what a graceful Shutdown of a static world runs once its barrier is
// over (no worker makes calls any more) and before this worker closes; the reference
// operations it queues then go out before the streams close. The Python binding releases
// there the RRefs user code still holds, as torch's graceful shutdown deletes every user RRef:
// their owners then hold no forks of a worker that is gone. Call it before Shutdown.
func (a *Agent) SetBeforeClose(f func(ctx context.Context)) { a.beforeClose = f }

// beforeClosing runs once the barrier's first rounds are over (rounds of them): the hook
// SetBeforeClose set, then the reference operations it queued go to their owners, each owner
// is called (appliedMethod: its answer comes after it applied what came before on the same
// stream), and a last barrier round keeps every worker open until all have heard back.
func (a *Agent) beforeClosing(ctx context.Context, rounds int) error {
	if a.beforeClose != nil {
		a.beforeClose(ctx)
	}
	var owners []*member
	for _, m := range a.world().byID {
		if m.info.ID != a.self.ID && m.peer.hasRefOps() {
			owners = append(owners, m)
		}
	}
	a.flushRefOps(ctx)
	var calls []*CallFuture
	for _, m := range owners {
		calls = append(calls, a.CallRank(ctx, m.info.ID, appliedMethod, Message{}))
	}
	for _, c := range calls {
		c.Result() // an owner that cannot be reached is closing too, or gone
	}
	if rounds >= rendezvous.MaxShutdownRounds {
		return nil
	}
	_, err := a.barrierRound(ctx, rounds)
	return err
}

// appliedMethod is the agent's own method that answers at once: a caller that queued
// reference operations for a worker knows from its answer that they were applied.
const appliedMethod = ReservedMethodPrefix + "applied"

// leave is a dynamic world's shutdown: no barrier, as in torch, since the others stay. A
// graceful one waits for this worker's own calls first. Either way the store and every member
// hear that this worker left (a non-graceful one waits at most leaveTimeout for them).
func (a *Agent) leave(ctx context.Context, graceful bool) error {
	a.state.Store(stateDraining)
	var err error
	if graceful {
		err = a.waitOwnCalls(ctx)
	}
	// The others must hear of it even if ctx ended, and a store or a peer that is gone must
	// not hold a shutdown that has no deadline.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	defer cancel()
	if graceful {
		a.flushRefOps(ctx)
	}
	return errors.Join(err, a.leaveDynamic(ctx))
}

// deadlineSlack is how close to its context's deadline a store's wait may end and still be
// taken for that deadline's.
const deadlineSlack = 100 * time.Millisecond

// leaveTimeout bounds telling the store and the world of a leave.
const leaveTimeout = 5 * time.Second

// waitOwnCalls waits until every call this worker made has completed, or ctx ends.
func (a *Agent) waitOwnCalls(ctx context.Context) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for a.outstanding.Load() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			err := fmt.Errorf("%d calls of this worker still pending: %w", a.outstanding.Load(), ctx.Err())
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%w: %w", ErrShutdownTimedOut, err)
			}
			return fmt.Errorf("graceful shutdown: %w", err)
		}
	}
	return nil
}

// drain is graceful shutdown's barrier, in rounds: in each, a worker waits until its own
// calls have completed and then gathers with the others the count of calls each has ever
// made. A handler can make a call after its worker joined a round (work a reply set going);
// the barrier ends only once a round finds every count as the round before found it, so no
// worker closes while such a call is in flight. torch repeats its barrier for the same reason.
func (a *Agent) drain(ctx context.Context) (rounds int, err error) {
	a.state.Store(stateDraining)
	var previous [][]byte
	for round := range rendezvous.MaxShutdownRounds {
		values, err := a.barrierRound(ctx, round)
		if err != nil {
			return round + 1, err
		}
		if values == nil { // the store is gone: no rounds left to hold
			return rendezvous.MaxShutdownRounds, nil
		}
		if round > 0 && sameCounts(values, previous) {
			return round + 1, nil
		}
		previous = values
	}
	a.log.Warn(fmt.Sprintf("tensorplay-rpc: graceful shutdown: workers still made calls after %d barrier rounds; leaving", rendezvous.MaxShutdownRounds), "worker", a.self.Name)
	return rendezvous.MaxShutdownRounds, nil
}

// barrierRound waits for this worker's calls and holds one round of the shutdown barrier; it
// returns every worker's count of calls made (nil for a worker that is gone), or nil values
// if the store is gone and there is no barrier left to hold.
func (a *Agent) barrierRound(ctx context.Context, round int) ([][]byte, error) {
	if err := a.waitOwnCalls(ctx); err != nil {
		return nil, err
	}
	// Reference operations still queued go out before the barrier, so owners see them
	// before anyone closes.
	a.flushRefOps(ctx)
	var wait time.Duration
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	name := rendezvous.ShutdownRoundN(round)
	if marker, ok := a.store.(rendezvous.GoneMarker); ok {
		// This worker hosts the store: while the barrier waits, it looks for workers that are
		// gone, so the others do not wait for them forever.
		stop := a.watchForGone(marker, name)
		defer stop()
	}
	count := binary.BigEndian.AppendUint64(nil, uint64(a.started.Load()))
	values, err := a.store.Gather(ctx, rendezvous.GatherRequest{
		Round: name, Rank: a.self.ID, Size: len(a.world().sorted), Who: fmt.Sprintf("%q", a.self.Name),
		Value: count, WaitMs: wait.Milliseconds(), FailFast: true,
	})
	if errors.Is(err, rendezvous.ErrStoreGone) {
		a.noteGone(0, "it hosted the rendezvous store; leaving without the shutdown barrier")
		return nil, nil
	}
	if err != nil {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < deadlineSlack {
			// The store's wait ended with ctx's (the remote store's error says no more).
			return nil, fmt.Errorf("%w: %w", ErrShutdownTimedOut, err)
		}
		return nil, fmt.Errorf("graceful shutdown barrier: %w", err)
	}
	for rank, v := range values {
		if v == nil {
			a.noteGone(rank, "graceful shutdown did not wait for it")
		}
	}
	return values, nil
}

// sameCounts reports whether no worker made a call between two barrier rounds; a worker gone
// in either round counts as idle.
func sameCounts(now, before [][]byte) bool {
	if len(now) != len(before) {
		return false
	}
	for rank := range now {
		if now[rank] != nil && before[rank] != nil && !bytes.Equal(now[rank], before[rank]) {
			return false
		}
	}
	return true
}

const (
	// goneProbeEvery is how often the store's host looks for gone workers during a barrier.
	goneProbeEvery = 300 * time.Millisecond
	// forgetProbeEvery is how often an owner asks again after a worker whose stream ended did
	// not answer.
	forgetProbeEvery = 2 * time.Second
)

// watchForGone marks workers that are gone as gone in round, until stopped: those whose host
// says so, and those that have not answered for the peer timeout (a partitioned worker must
// not hold the barrier forever).
func (a *Agent) watchForGone(store rendezvous.GoneMarker, round string) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(goneProbeEvery)
		defer tick.Stop()
		silentSince := map[int]time.Time{}
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for _, w := range a.world().sorted {
				if w.ID == a.self.ID {
					continue
				}
				switch err := a.probe(w, false); {
				case err == nil:
					delete(silentSince, w.ID)
				case errors.Is(err, transport.ErrGone):
					store.MarkGone(round, w.ID)
				default:
					if _, ok := silentSince[w.ID]; !ok {
						silentSince[w.ID] = time.Now()
					}
					if time.Since(silentSince[w.ID]) > a.peerTimeout {
						store.MarkGone(round, w.ID)
					}
				}
			}
		}
	}()
	return func() { close(done) }
}

// probe asks whether worker's agent is there: nil if it is, an error wrapping
// transport.ErrGone if its host says it is gone, another error if there was no telling. With
// openStream a stream must open: a killed process's listening socket can outlive its streams
// for a moment, and its host then accepts a connection no one will serve; without it a
// connection is enough (the shutdown barrier asks every 300 ms, and a stream costs the peer a
// shared-memory region).
func (a *Agent) probe(w WorkerInfo, openStream bool) error {
	ctx, cancel := context.WithTimeout(a.serveCtx, time.Second)
	defer cancel()
	prober, canProbe := a.transport.(transport.Prober)
	if canProbe && !openStream {
		return prober.Probe(ctx, w.Addr)
	}
	s, err := a.transport.Dial(ctx, w.Addr)
	if err == nil {
		return s.Close()
	}
	if canProbe { // why the stream did not open: only a refusal says the worker is gone
		if perr := prober.Probe(ctx, w.Addr); errors.Is(perr, transport.ErrGone) {
			return perr
		}
	}
	return err
}

// forgetIfGone drops the RRef forks worker held once its host says it is gone: a dead worker
// will never release them. A worker that does not answer may only be cut off for a while (a
// link down, a host too loaded to reply): it keeps its forks, and is asked again every
// forgetProbeEvery until it answers or is gone.
func (a *Agent) forgetIfGone(m *member) {
	if !m.probing.CompareAndSwap(false, true) {
		return // already asking
	}
	defer m.probing.Store(false)
	w := m.info
	for !a.closing() {
		if a.world().byID[w.ID] != m {
			return // it left; dropMember did what is to be done
		}
		err := a.probe(w, true)
		if err == nil {
			return
		}
		if errors.Is(err, transport.ErrGone) {
			break
		}
		select {
		case <-a.serveCtx.Done():
			return
		case <-time.After(forgetProbeEvery):
		}
	}
	if a.closing() {
		return
	}
	if a.dynamic {
		a.memberGone(m) // which releases its forks when it is dropped from the world
		return
	}
	a.releaseForksOf(m)
	m.peer.dropRefOps() // what this worker had for it: its values went with its process
}

// releaseForksOf drops the RRef forks member m held: it is gone, and will never release them.
func (a *Agent) releaseForksOf(m *member) {
	w := m.info
	dropped := a.refs.releaseHolder(w.ID, m.epoch)
	if len(dropped) > 0 {
		a.log.Warn("tensorplay-rpc: dropped RRefs held only by a worker that is gone", "worker", w.Name, "count", len(dropped))
	}
	for _, id := range dropped {
		a.rrefDropped(id)
	}
}

// noteGone records and logs that worker rank is gone.
func (a *Agent) noteGone(rank int, why string) {
	a.goneMu.Lock()
	defer a.goneMu.Unlock()
	for _, g := range a.gone {
		if g.ID == rank {
			return
		}
	}
	m := a.world().byID[rank]
	if m == nil {
		return
	}
	w := m.info
	a.gone = append(a.gone, w)
	a.log.Warn(fmt.Sprintf("tensorplay-rpc: worker %q is gone: %s", w.Name, why), "worker", a.self.Name)
}

// Gone lists the workers this one found gone while shutting down.
func (a *Agent) Gone() []WorkerInfo {
	a.goneMu.Lock()
	defer a.goneMu.Unlock()
	return append([]WorkerInfo(nil), a.gone...)
}

// close stops serving and fails whatever is still pending.
func (a *Agent) close() {
	a.state.Store(stateClosed)
	// The transport goes first: handlers that see their context end must not get a reply out.
	a.transport.Close()
	a.stopServing()
	w := a.world()
	if w != nil {
		for _, m := range w.byID {
			m.peer.mu.Lock()
			c := m.peer.conn
			m.peer.mu.Unlock()
			if c != nil {
				c.fail(ErrShutdown)
			}
		}
	}
	if a.storeServer != nil {
		a.storeServer.Close()
	}
	if leaver, ok := a.store.(rendezvous.Leaver); ok && w != nil && !a.dynamic {
		if err := leaver.Leave(a.self.ID, len(w.sorted)); err != nil {
			a.log.Warn("tensorplay-rpc: leaving the store", "err", err)
		}
	}
	if a.store != nil {
		a.store.Close()
	}
}

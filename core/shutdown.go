package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
)

// closing reports whether shutdown has begun closing the agent.
func (a *Agent) closing() bool { return a.state.Load() == stateClosed }

// Shutdown leaves the world. Graceful shutdown is a barrier: it waits until this worker's own
// calls have completed and every other worker has called Shutdown too, so no worker stops
// while others still call it; ctx bounds the wait. Non-graceful shutdown closes at once and
// fails pending calls with ErrShutdown. Only the first call does anything.
func (a *Agent) Shutdown(ctx context.Context, graceful bool) error {
	err := ErrShutdown
	a.shutdown.Do(func() {
		err = nil
		if graceful {
			err = a.drain(ctx)
		}
		a.close()
	})
	return err
}

func (a *Agent) drain(ctx context.Context) error {
	a.state.Store(stateDraining)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for a.outstanding.Load() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("graceful shutdown: %d calls of this worker still pending: %w", a.outstanding.Load(), ctx.Err())
		}
	}
	// Reference operations still queued go out before the barrier, so owners see them
	// before anyone closes.
	a.flushRefOps(ctx)
	var wait time.Duration
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if marker, ok := a.store.(rendezvous.GoneMarker); ok {
		// This worker hosts the store: while the barrier waits, it looks for workers that are
		// gone, so the others do not wait for them forever.
		stop := a.watchForGone(marker, rendezvous.ShutdownRound)
		defer stop()
	}
	values, err := a.store.Gather(ctx, rendezvous.GatherRequest{
		Round: rendezvous.ShutdownRound, Rank: a.self.ID, Size: len(a.workers), Who: fmt.Sprintf("%q", a.self.Name),
		Value: []byte{1}, WaitMs: wait.Milliseconds(), FailFast: true,
	})
	if errors.Is(err, rendezvous.ErrStoreGone) {
		a.noteGone(0, "it hosted the rendezvous store; leaving without the shutdown barrier")
		return nil
	}
	if err != nil {
		return fmt.Errorf("graceful shutdown barrier: %w", err)
	}
	for rank, v := range values {
		if v == nil && rank < len(a.workers) {
			a.noteGone(rank, "graceful shutdown did not wait for it")
		}
	}
	return nil
}

const (
	// goneProbeEvery is how often the store's host looks for gone workers during a barrier.
	goneProbeEvery = 300 * time.Millisecond
)

// watchForGone marks workers whose agents no longer answer as gone in round, until stopped.
func (a *Agent) watchForGone(store rendezvous.GoneMarker, round string) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(goneProbeEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for _, w := range a.workers {
				if w.ID != a.self.ID && !a.answers(w) {
					store.MarkGone(round, w.ID)
				}
			}
		}
	}()
	return func() { close(done) }
}

// answers reports whether worker's agent accepts a connection.
func (a *Agent) answers(w WorkerInfo) bool {
	ctx, cancel := context.WithTimeout(a.serveCtx, time.Second)
	defer cancel()
	s, err := a.transport.Dial(ctx, w.Addr)
	if err != nil {
		return false
	}
	s.Close()
	return true
}

// forgetIfGone drops the RRef forks worker held if its agent no longer answers: a dead
// worker will never release them.
func (a *Agent) forgetIfGone(w WorkerInfo) {
	if a.closing() || a.answers(w) {
		return
	}
	dropped := a.refs.releaseHolder(w.ID)
	if len(dropped) > 0 {
		a.log.Warn("tensorplay-rpc: dropped RRefs held only by a worker that is gone", "worker", w.Name, "count", len(dropped))
	}
	for _, id := range dropped {
		if a.onRRefDropped != nil {
			a.onRRefDropped(id)
		}
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
	w := a.workers[rank]
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
	for _, p := range a.peers {
		p.mu.Lock()
		c := p.conn
		p.mu.Unlock()
		if c != nil {
			c.fail(ErrShutdown)
		}
	}
	if a.storeServer != nil {
		a.storeServer.Close()
	}
	if leaver, ok := a.store.(rendezvous.Leaver); ok && a.workers != nil {
		if err := leaver.Leave(a.self.ID, len(a.workers)); err != nil {
			a.log.Warn("tensorplay-rpc: leaving the store", "err", err)
		}
	}
	if a.store != nil {
		a.store.Close()
	}
}

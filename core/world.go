package core

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// member is one worker of the world as this agent knows it, with the state kept per worker.
// A worker that leaves a dynamic world and joins it again is a new member (a new epoch).
type member struct {
	info  WorkerInfo
	epoch uint64 // the store's version when it joined; 0 in a static world
	peer  *peer
	// served holds a slot per call of this worker being served (Config.MaxServedPerCaller).
	served chan struct{}
	// refsApplied is the number of the last reference operation applied from this worker
	// (see applyRefOpsFrom).
	refsApplied atomic.Uint64
	probing     atomic.Bool // forgetIfGone is asking whether it is gone
	stats       peerStats   // the traffic with it (Metrics)
}

// world is the agent's view of its world at one version: never changed once published, so
// readers take it with one atomic load. A static world has one version; a dynamic world's
// follows the store's (see membership.go).
type world struct {
	version uint64 // the store's, in a dynamic world
	change  uint64 // counts the views this agent has had (WorldVersion)
	byID    map[int]*member
	byName  map[string]*member
	sorted  []WorkerInfo // by id
}

func (a *Agent) newMember(info WorkerInfo, epoch uint64) *member {
	m := &member{info: info, epoch: epoch, served: make(chan struct{}, a.maxServedPerCaller)}
	m.peer = &peer{agent: a, info: info}
	if a.dynamic {
		m.peer.broke = func() { go a.forgetIfGone(m) }
	}
	return m
}

// newWorld indexes members.
func newWorld(version uint64, members []*member) *world {
	w := &world{version: version, byID: make(map[int]*member, len(members)), byName: make(map[string]*member, len(members))}
	for _, m := range members {
		w.byID[m.info.ID] = m
		w.byName[m.info.Name] = m
		w.sorted = append(w.sorted, m.info)
	}
	slices.SortFunc(w.sorted, func(x, y WorkerInfo) int { return x.ID - y.ID })
	return w
}

// world is the agent's current view of the world.
func (a *Agent) world() *world { return a.view.Load() }

// setWorld publishes w as the agent's view; a.worldMu is held (or the agent is starting).
func (a *Agent) setWorld(w *world) {
	if old := a.world(); old != nil {
		w.change = old.change + 1
	}
	a.view.Store(w)
}

// member returns the worker of that id, or an error naming why there is none: never was, or
// left the world.
func (a *Agent) member(id int) (*member, error) {
	w := a.world()
	if m := w.byID[id]; m != nil {
		return m, nil
	}
	if info, ok := a.leftWorker(id); ok {
		return nil, fmt.Errorf("worker %q (id %d) %w", info.Name, id, ErrWorkerLeft)
	}
	if !a.dynamic {
		return nil, fmt.Errorf("%w: id %d is not a worker of this world (world size %d)", ErrUnknownWorker, id, len(w.sorted))
	}
	return nil, fmt.Errorf("%w: id %d is not a worker of this world (its members now: %d)", ErrUnknownWorker, id, len(w.sorted))
}

// Self is this worker.
func (a *Agent) Self() WorkerInfo { return a.self }

// ListenHost is the host this agent listens on: Config.ListenHost, or its address toward the
// rendezvous store.
func (a *Agent) ListenHost() string { return a.listenHost }

// Workers lists every worker of the world now, by id. A dynamic world's changes as workers
// join and leave (WorldVersion counts the changes).
func (a *Agent) Workers() []WorkerInfo { return slices.Clone(a.world().sorted) }

// Worker looks a worker of the world up by name.
func (a *Agent) Worker(name string) (WorkerInfo, bool) {
	m := a.world().byName[name]
	if m == nil {
		return WorkerInfo{}, false
	}
	return m.info, true
}

// MemberEpoch identifies the member of that id now: the store's version when it joined a
// dynamic world (0 in a static one), or -1 if no worker of that id is in the world. A worker
// that left and joined again has a new epoch.
func (a *Agent) MemberEpoch(id int) int64 {
	m := a.world().byID[id]
	if m == nil {
		return -1
	}
	return int64(m.epoch)
}

// WorldVersion numbers this agent's view of the world: it grows whenever a worker joins or
// leaves a dynamic world, and never changes in a static one.
func (a *Agent) WorldVersion() uint64 { return a.world().change }

// Dynamic reports whether the world is dynamic (Config.WorldSize 0): workers join and leave
// one at a time.
func (a *Agent) Dynamic() bool { return a.dynamic }

package core

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// A dynamic world (Config.WorldSize 0, torch's world_size=None) has no fixed size: workers join
// one at a time and leave with Shutdown. The store on rank 0 holds the membership and numbers
// its versions; it is the truth, and each agent's view (world) follows it:
//
//   - A joiner adds itself to the store, then tells every member (memberMethod) and returns
//     only once each has its record, so after Start everyone can call it. A member that hears
//     from a worker it does not know yet asks the store before refusing it.
//   - A leaver waits for its own calls, removes itself from the store, tells every member, and
//     closes. Calls to it fail at once, naming it (ErrWorkerLeft); the RRef forks it held are
//     released on their owners.
//   - A worker whose process died is removed by whoever finds it gone: the store's host looks
//     for gone members every memberProbeEvery, and any worker whose stream from a member ended
//     asks too (forgetIfGone). Only a gone process counts: one that is slow or cut off stays.
//
// Unlike torch 1.13, joins and leaves need no lock held across the world (the store's single
// operations order them), a worker may join again under its old name and rank, and a dead
// worker does not stay in everyone's world.

// memberMethod is the agent's own method by which a worker tells another that the world
// changed; its request is the store's version after the change (8 bytes, big-endian).
const memberMethod = "_tensorplay/membership"

const (
	// memberProbeEvery is how often the store's host looks for members that are gone.
	memberProbeEvery = time.Second
	// notifyTimeout bounds telling one member of a change; one that does not answer hears of
	// it from the store when it next needs to.
	notifyTimeout = 10 * time.Second
	// maxLeftRemembered bounds the workers remembered as having left (for error messages).
	maxLeftRemembered = 4096
	// takenRetryPause spaces a joiner's attempts while its rank or name is held by a member
	// that neither answers nor is known to be gone.
	takenRetryPause = 200 * time.Millisecond
)

// memberStore is the store's membership, or an error saying why a dynamic world cannot use it.
func (a *Agent) memberStore() (rendezvous.MemberStore, error) {
	ms, ok := a.store.(rendezvous.MemberStore)
	if !ok {
		return nil, fmt.Errorf("%w: a dynamic world (world_size=None) needs a tcp:// or env:// init_method: its rank 0 holds the membership, which a %T cannot", ErrRendezvous, a.store)
	}
	return ms, nil
}

// joinDynamic adds this worker to the store's membership and tells every member.
func (a *Agent) joinDynamic(ctx context.Context) error {
	store, err := a.memberStore()
	if err != nil {
		return err
	}
	// The nonce tells this process's join from a dead one's that had the same address.
	record, err := msgpack.Marshal(&memberRecord{Info: a.self, Nonce: rand.Uint64()})
	if err != nil {
		return err
	}
	var ms rendezvous.Membership
	for {
		ms, err = store.JoinMembers(ctx, rendezvous.Member{Rank: a.self.ID, Name: a.self.Name, Value: record})
		taken, isTaken := errors.AsType[*rendezvous.TakenError](err)
		if !isTaken {
			break
		}
		// The holder may be a dead process of the same worker, not yet found gone: ask it.
		holder, derr := decodeMember(taken.Holder)
		if derr != nil {
			return derr
		}
		switch perr := a.probe(holder.info, true); {
		case errors.Is(perr, transport.ErrGone):
			if _, _, err := store.LeaveMembers(ctx, holder.info.ID, holder.epoch); err != nil {
				return fmt.Errorf("%w: %w", ErrRendezvous, err)
			}
			continue
		case perr == nil && taken.ByName:
			return &DuplicateNameError{Name: a.self.Name, First: holder.info.ID, Later: a.self.ID}
		case perr == nil:
			return fmt.Errorf("%w: rank %d is taken by worker %q, which is in the world", ErrRendezvous, a.self.ID, holder.info.Name)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w (its holder did not answer, nor is it known to be gone)", ErrRendezvous, taken)
		case <-time.After(takenRetryPause):
		}
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRendezvous, err)
	}
	a.worldMu.Lock()
	a.applyMembership(ms)
	a.worldMu.Unlock()
	me := a.world().byID[a.self.ID]
	if me == nil || me.info != a.self {
		return fmt.Errorf("%w: the store's membership does not hold this worker after it joined", ErrRendezvous)
	}
	a.epoch = me.epoch
	// RRef ids count from the epoch, so those of an earlier member of the same rank, which
	// may still be referenced, are never made again.
	a.nextLocalID.Store(int64(a.epoch) << 32)
	a.Register(memberMethod, HandlerFunc(a.serveMembership))
	close(a.ready)
	a.notifyMembers(ctx, ms.Version)
	if a.storeServer != nil {
		go a.watchMembers()
	}
	return nil
}

// memberRecord is what a worker of a dynamic world publishes in the store.
type memberRecord struct {
	Info  WorkerInfo `msgpack:"info"`
	Nonce uint64     `msgpack:"nonce"`
}

// decodeMember reads a member's record from the store.
func decodeMember(m rendezvous.Member) (*member, error) {
	var rec memberRecord
	if err := msgpack.Unmarshal(m.Value, &rec); err != nil {
		return nil, fmt.Errorf("%w: member %q has a bad record: %w", ErrRendezvous, m.Name, err)
	}
	info := rec.Info
	if info.ID != m.Rank || info.Name != m.Name {
		return nil, fmt.Errorf("%w: member %q of rank %d has a record for %v", ErrRendezvous, m.Name, m.Rank, info)
	}
	if err := ValidateName(info.Name); err != nil {
		return nil, fmt.Errorf("%w: rank %d: %w", ErrRendezvous, m.Rank, err)
	}
	return &member{info: info, epoch: m.Epoch}, nil
}

// applyMembership makes ms the agent's world if it is newer: members it keeps stay as they
// are, new ones are added, and those gone are dropped (see dropMember). A record that is bad
// (a stranger's, or corrupt) is left out, with a warning, so it cannot keep the world from
// changing. a.worldMu is held.
func (a *Agent) applyMembership(ms rendezvous.Membership) {
	old := a.world()
	if old != nil && ms.Version <= old.version {
		return
	}
	members := make([]*member, 0, len(ms.Members))
	kept := map[*member]bool{}
	names := map[string]int{}
	for _, rec := range ms.Members {
		m, err := decodeMember(rec)
		if err == nil {
			if other, dup := names[m.info.Name]; dup {
				err = &DuplicateNameError{Name: m.info.Name, First: other, Later: m.info.ID}
			}
		}
		if err != nil {
			a.log.Warn("tensorplay-rpc: left a bad member record of the store out of the world", "worker", a.self.Name, "err", err)
			continue
		}
		names[m.info.Name] = m.info.ID
		if old != nil {
			if was := old.byID[m.info.ID]; was != nil && was.epoch == m.epoch && was.info == m.info {
				members = append(members, was)
				kept[was] = true
				continue
			}
		}
		members = append(members, a.newMember(m.info, m.epoch))
	}
	a.setWorld(newWorld(ms.Version, members))
	if old != nil {
		for _, m := range old.byID {
			if !kept[m] {
				a.dropMember(m)
			}
		}
	}
}

// dropMember ends everything this agent has with a member that left: its calls fail naming
// it, reference operations for it are dropped, and the RRef forks it held are released.
func (a *Agent) dropMember(m *member) {
	if m.info.ID == a.self.ID {
		return
	}
	a.rememberLeft(m.info)
	a.log.Debug(fmt.Sprintf("tensorplay-rpc: worker %q left the world", m.info.Name), "worker", a.self.Name)
	m.peer.leave(fmt.Errorf("worker %q (id %d) %w", m.info.Name, m.info.ID, ErrWorkerLeft))
	a.releaseForksOf(m)
}

func (a *Agent) rememberLeft(w WorkerInfo) {
	a.leftMu.Lock()
	defer a.leftMu.Unlock()
	if a.left == nil || len(a.left) >= maxLeftRemembered {
		a.left = map[int]WorkerInfo{}
	}
	a.left[w.ID] = w
}

// leftWorker is the last worker of that id known to have left, if it is not back.
func (a *Agent) leftWorker(id int) (WorkerInfo, bool) {
	a.leftMu.Lock()
	defer a.leftMu.Unlock()
	w, ok := a.left[id]
	return w, ok
}

// refreshWorld reads the membership from the store unless the world is at version atLeast
// already (0: read it anyway).
func (a *Agent) refreshWorld(ctx context.Context, atLeast uint64) error {
	if !a.dynamic {
		return nil
	}
	if atLeast > 0 && a.world().version >= atLeast {
		return nil
	}
	store, err := a.memberStore()
	if err != nil {
		return err
	}
	// Read outside the lock, so a slow store holds no one else up; an older read that
	// comes last changes nothing (applyMembership).
	ms, err := store.Members(ctx)
	if err != nil {
		return err
	}
	a.worldMu.Lock()
	defer a.worldMu.Unlock()
	a.applyMembership(ms)
	return nil
}

// RefreshWorld reads a dynamic world's membership from the store now, as when a worker
// named by a caller is not in this agent's view: every member hears of each join and leave
// within notifyTimeout, but one that was frozen then may have missed it. Static worlds have
// nothing to read.
func (a *Agent) RefreshWorld(ctx context.Context) error { return a.refreshWorld(ctx, 0) }

// knownCaller returns the member that a stream's hello names, asking the store first if it
// joined after this worker's view (its epoch is newer). A member this worker knows has left,
// or was replaced by a later member of its rank, is refused.
func (a *Agent) knownCaller(h wire.Hello) *member {
	is := func(m *member) bool { return m != nil && m.info.Name == h.Name && m.epoch == h.Epoch }
	w := a.world()
	if m := w.byID[h.Rank]; is(m) {
		return m
	}
	if !a.dynamic || h.Epoch <= w.version {
		return nil
	}
	ctx, cancel := context.WithTimeout(a.serveCtx, notifyTimeout)
	defer cancel()
	if err := a.refreshWorld(ctx, h.Epoch); err != nil {
		a.log.Debug("tensorplay-rpc: could not read the membership", "err", err)
	}
	if m := a.world().byID[h.Rank]; is(m) {
		return m
	}
	return nil
}

// serveMembership is memberMethod's handler: the world changed, as of the version given.
func (a *Agent) serveMembership(ctx context.Context, req Message) (Message, error) {
	if len(req.Payload) != 8 {
		return Message{}, fmt.Errorf("a membership notice must carry 8 bytes, got %d", len(req.Payload))
	}
	return Message{}, a.refreshWorld(ctx, binary.BigEndian.Uint64(req.Payload))
}

// notifyMembers tells every other member that the world is at version, and waits for their
// answers (each for at most notifyTimeout).
func (a *Agent) notifyMembers(ctx context.Context, version uint64) {
	ctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	notice := Message{Payload: binary.BigEndian.AppendUint64(nil, version)}
	var wg sync.WaitGroup
	for _, w := range a.world().sorted {
		if w.ID == a.self.ID {
			continue
		}
		wg.Go(func() {
			if _, err := a.CallRank(ctx, w.ID, memberMethod, notice).Result(); err != nil {
				a.log.Debug("tensorplay-rpc: a member did not hear of a change of the world", "member", w.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// leaveDynamic removes this worker from the store's membership and tells every member.
func (a *Agent) leaveDynamic(ctx context.Context) error {
	store, err := a.memberStore()
	if err != nil {
		return err
	}
	ms, _, err := store.LeaveMembers(ctx, a.self.ID, a.epoch)
	if err != nil {
		return fmt.Errorf("leaving the world: %w", err)
	}
	a.notifyMembersExcept(ctx, ms)
	return nil
}

// notifyMembersExcept tells the members of ms (which no longer holds this worker, or a worker
// found gone) of ms's version; the current world still lists whom to tell.
func (a *Agent) notifyMembersExcept(ctx context.Context, ms rendezvous.Membership) {
	a.worldMu.Lock()
	self := a.world().byID[a.self.ID]
	a.applyMembership(ms)
	if self != nil && a.world().byID[a.self.ID] == nil {
		// This worker left: it keeps itself in its view, so it can still call itself while
		// it closes.
		w := a.world()
		a.setWorld(newWorld(w.version, append(membersOf(w), self)))
	}
	a.worldMu.Unlock()
	a.notifyMembers(ctx, ms.Version)
}

func membersOf(w *world) []*member {
	ms := make([]*member, 0, len(w.byID))
	for _, m := range w.byID {
		ms = append(ms, m)
	}
	return ms
}

// memberGone removes a member whose process is gone from the store's membership, and tells
// the others if this worker was the one to remove it.
func (a *Agent) memberGone(m *member) {
	store, err := a.memberStore()
	if err != nil || a.closing() {
		return
	}
	ctx, cancel := context.WithTimeout(a.serveCtx, notifyTimeout)
	defer cancel()
	ms, removed, err := store.LeaveMembers(ctx, m.info.ID, m.epoch)
	if err != nil {
		// The store is gone too (rank 0 ended): this worker's view is all that is left to fix.
		a.log.Debug("tensorplay-rpc: could not remove a gone member from the store", "member", m.info.Name, "err", err)
		a.dropLocally(m)
		return
	}
	if !removed {
		a.worldMu.Lock()
		a.applyMembership(ms)
		a.worldMu.Unlock()
		return
	}
	a.log.Warn(fmt.Sprintf("tensorplay-rpc: worker %q is gone (its process ended without leaving); it is dropped from the world", m.info.Name), "worker", a.self.Name)
	a.notifyMembersExcept(ctx, ms)
}

// dropLocally drops a gone member from this worker's view alone.
func (a *Agent) dropLocally(m *member) {
	a.worldMu.Lock()
	w := a.world()
	if w.byID[m.info.ID] != m {
		a.worldMu.Unlock()
		return
	}
	rest := membersOf(w)
	rest = slices.DeleteFunc(rest, func(x *member) bool { return x == m })
	a.setWorld(newWorld(w.version, rest))
	a.worldMu.Unlock()
	a.dropMember(m)
}

// watchMembers runs on the store's host: it drops members whose process is gone.
func (a *Agent) watchMembers() {
	tick := time.NewTicker(memberProbeEvery)
	defer tick.Stop()
	for {
		select {
		case <-a.serveCtx.Done():
			return
		case <-tick.C:
		}
		for _, m := range a.world().byID {
			if m.info.ID == a.self.ID || a.closing() {
				continue
			}
			if err := a.probe(m.info, false); errors.Is(err, transport.ErrGone) {
				a.memberGone(m)
			}
		}
	}
}

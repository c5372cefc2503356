package core_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

func TestRRefForksAcrossWorkers(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		var mu sync.Mutex
		dropped := map[wire.RRefID]bool{}
		opts.Handlers = testHandlers(nil)
		cfgs := coretest.Configs(t, 3, opts)
		cfgs[0].OnRRefDropped = func(id wire.RRefID) { mu.Lock(); dropped[id] = true; mu.Unlock() }
		agents := coretest.Start(t, cfgs).Agents
		owner, user, third := agents[0], agents[1], agents[2]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		// user creates an RRef owned by worker 0 (as remote() does), forks it to a third
		// worker, then releases its own fork: the value must stay while the third holds one.
		id := user.NewRRefID()
		userFork, thirdFork := user.NewRRefID(), user.NewRRefID()
		if err := user.AddFork(ctx, 0, id, userFork, 1); err != nil {
			t.Fatal(err)
		}
		if err := user.AddFork(ctx, 0, id, thirdFork, 2); err != nil {
			t.Fatal(err)
		}
		user.ReleaseFork(0, id, userFork)
		// The release goes before this call on the user's ordered stream to the owner: once
		// the call is answered, the owner has applied it.
		if _, err := user.Call(ctx, "w0", "echo", core.Message{}); err != nil {
			t.Fatal(err)
		}
		if n := owner.OwnedRRefs(); n != 1 {
			t.Fatalf("owner tracks %d RRefs after the user released one of two forks, want 1", n)
		}
		mu.Lock()
		early := dropped[id]
		mu.Unlock()
		if early {
			t.Fatal("dropped while the third worker still holds a fork")
		}
		third.ReleaseFork(0, id, thirdFork)
		waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return dropped[id] })
		if n := owner.OwnedRRefs(); n != 0 {
			t.Fatalf("owner still tracks %d RRefs", n)
		}
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAReleaseThatOvertakesItsRegistrationKeepsTheValue: a fork handed to a third worker can be
// released by it before its parent's registration of the fork reaches the owner (they travel on
// different streams). The owner must neither drop the value then, while the parent's release
// of its own fork is also on the way, nor keep it once both have arrived.
func TestAReleaseThatOvertakesItsRegistrationKeepsTheValue(t *testing.T) {
	network := transport.NewInmemNetwork()
	var mu sync.Mutex
	dropped := 0
	cfgs := coretest.Configs(t, 3, coretest.Options{Handlers: testHandlers(nil), Network: network})
	cfgs[0].OnRRefDropped = func(wire.RRefID) { mu.Lock(); dropped++; mu.Unlock() }
	agents := coretest.Start(t, cfgs).Agents
	owner, parent, third := agents[0], agents[1], agents[2]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	droppedSoFar := func() int { mu.Lock(); defer mu.Unlock(); return dropped }

	id, parentFork, thirdFork := parent.NewRRefID(), parent.NewRRefID(), parent.NewRRefID()
	if err := parent.AddFork(ctx, 0, id, parentFork, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := parent.Call(ctx, "w0", "echo", core.Message{}); err != nil {
		t.Fatal(err) // carried the parent's own fork: registered once answered
	}

	// Everything the parent sends the owner from now on waits, in order, on the network.
	release := make(chan struct{})
	held := network.Inject(transport.Fault{From: parent.Self().Addr, To: owner.Self().Addr, Hold: release})
	if err := parent.AddFork(ctx, 0, id, thirdFork, 2); err != nil {
		t.Fatal(err)
	}
	if err := parent.ReleaseFork(0, id, parentFork); err != nil {
		t.Fatal(err)
	}
	parentAnswered := parent.CallAsync(ctx, "w0", "echo", core.Message{})
	if err := third.ReleaseFork(0, id, thirdFork); err != nil {
		t.Fatal(err)
	}
	if _, err := third.Call(ctx, "w0", "echo", core.Message{}); err != nil {
		t.Fatal(err) // the third worker's release went before it: applied once answered
	}
	if held.Hits() == 0 {
		t.Fatal("nothing of the parent's was held: the test did not set up the race")
	}
	if n := droppedSoFar(); n != 0 || owner.OwnedRRefs() != 1 {
		t.Fatalf("after the fork's release overtook its registration: dropped %d times, owner tracks %d RRefs; want 0 and 1", n, owner.OwnedRRefs())
	}

	close(release)
	if _, err := parentAnswered.Result(); err != nil {
		t.Fatal(err) // behind the parent's registration and release on its ordered stream
	}
	if n := droppedSoFar(); n != 1 || owner.OwnedRRefs() != 0 {
		t.Fatalf("once every operation arrived: dropped %d times, owner tracks %d RRefs; want 1 and 0", n, owner.OwnedRRefs())
	}
}

// TestForksReleasedBeforeClosingReachTheirOwner: a graceful shutdown runs the hook
// SetBeforeClose set once the barrier is over, and the releases it queues are applied by their
// owners before any worker closes (as the Python binding releases the RRefs user code still
// holds, and torch's graceful shutdown deletes them).
func TestForksReleasedBeforeClosingReachTheirOwner(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		agents := coretest.Start(t, coretest.Configs(t, 2, opts)).Agents
		owner, holder := agents[0], agents[1]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var ids, forks []wire.RRefID
		for range 100 {
			id, fork := holder.NewRRefID(), holder.NewRRefID()
			if err := holder.AddFork(ctx, 0, id, fork, 1); err != nil {
				t.Fatal(err)
			}
			ids, forks = append(ids, id), append(forks, fork)
		}
		if _, err := holder.Call(ctx, "w0", "echo", core.Message{}); err != nil { // the forks have reached the owner
			t.Fatal(err)
		}
		var hookRan atomic.Bool
		holder.SetBeforeClose(func(context.Context) {
			hookRan.Store(true)
			for i := range ids {
				holder.ReleaseFork(0, ids[i], forks[i])
			}
		})
		done := make(chan error, 2)
		for _, a := range agents {
			go func() { done <- a.Shutdown(ctx, true) }()
		}
		for range agents {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if !hookRan.Load() {
			t.Fatal("the holder's hook never ran")
		}
		if n := owner.OwnedRRefs(); n != 0 {
			t.Fatalf("the owner still held %d RRefs when it closed", n)
		}
	})
}

// TestAGapInReferenceOperationsHeals: an owner that finds reference operations missing before
// a batch refuses it and says what it applied; the holder sends everything after that again,
// and the owner ends up with the counts it should have (the lost release applied too).
func TestAGapInReferenceOperationsHeals(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		agents := coretest.Start(t, coretest.Configs(t, 2, opts)).Agents
		owner, holder := agents[0], agents[1]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lost, lostFork := holder.NewRRefID(), holder.NewRRefID()
		if err := holder.AddFork(ctx, 0, lost, lostFork, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Call(ctx, "w0", "echo", core.Message{}); err != nil {
			t.Fatal(err)
		}
		holder.ReleaseForkLostInFlight(0, lost, lostFork)
		later, laterFork := holder.NewRRefID(), holder.NewRRefID()
		if err := holder.AddFork(ctx, 0, later, laterFork, 1); err != nil { // numbered after the lost one
			t.Fatal(err)
		}
		if _, err := holder.Call(ctx, "w0", "echo", core.Message{}); err != nil {
			t.Fatal(err)
		}
		holder.ReleaseFork(0, later, laterFork)
		deadline := time.Now().Add(10 * time.Second)
		for owner.OwnedRRefs() != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := owner.OwnedRRefs(); n != 0 {
			t.Fatalf("the owner still tracks %d RRefs after every fork was released, one release lost on the way", n)
		}
	})
}

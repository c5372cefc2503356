package core_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

func TestRRefForksAcrossWorkers(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		var mu sync.Mutex
		dropped := map[wire.RRefID]bool{}
		cfgs := coretest.Configs(t, 3, opts)
		cfgs[0].OnRRefDropped = func(id wire.RRefID) { mu.Lock(); dropped[id] = true; mu.Unlock() }
		agents := coretest.Start(t, cfgs).Agents
		owner, user, third := agents[0], agents[1], agents[2]
		ctx := context.Background()

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
		waitFor(t, func() bool { return owner.OwnedRRefs() == 1 })
		time.Sleep(50 * time.Millisecond)
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

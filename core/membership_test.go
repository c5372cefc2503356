package core_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// names lists the workers a sees, by id.
func names(a *core.Agent) string {
	var out []string
	for _, w := range a.Workers() {
		out = append(out, fmt.Sprintf("%d:%s", w.ID, w.Name))
	}
	return strings.Join(out, " ")
}

func echoHandlers() map[string]core.Handler {
	return map[string]core.Handler{"echo": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
		return core.Message{Payload: slices.Clone(req.Payload)}, nil
	})}
}

func callEcho(t *testing.T, from *core.Agent, to string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := from.Call(ctx, to, "echo", core.Message{Payload: []byte(from.Self().Name)})
	if err != nil || string(got.Payload) != from.Self().Name {
		t.Fatalf("%s → %s: %q, %v", from.Self().Name, to, got.Payload, err)
	}
}

func TestDynamicWorldFollowsJoinsAndLeaves(t *testing.T) {
	world := coretest.NewDynamicWorld(echoHandlers())
	w0, _ := world.Join(t, "w0", 0)
	if got := names(w0); got != "0:w0" {
		t.Fatalf("alone, w0 sees %q", got)
	}
	w1, _ := world.Join(t, "w1", 1)
	w5, _ := world.Join(t, "w5", 5) // ranks need not be dense
	for _, a := range []*core.Agent{w0, w1, w5} {
		if got := names(a); got != "0:w0 1:w1 5:w5" {
			t.Fatalf("%s sees %q after three joins", a.Self().Name, got)
		}
		for _, to := range []string{"w0", "w1", "w5"} {
			callEcho(t, a, to)
		}
	}
	before := w0.WorldVersion()

	if err := w1.Shutdown(testctx.For(t), true); err != nil {
		t.Fatalf("w1 leaves: %v", err)
	}
	for _, a := range []*core.Agent{w0, w5} {
		if got := names(a); got != "0:w0 5:w5" {
			t.Fatalf("%s sees %q once w1 left", a.Self().Name, got)
		}
		_, err := a.Call(testctx.For(t), "w1", "echo", core.Message{})
		if !errors.Is(err, core.ErrUnknownWorker) {
			t.Fatalf("call to w1 by name after it left: %v", err)
		}
		_, err = a.CallRank(testctx.For(t), 1, "echo", core.Message{}).Result()
		if !errors.Is(err, core.ErrWorkerLeft) || !strings.Contains(err.Error(), `"w1"`) {
			t.Fatalf("call to rank 1 after w1 left: %v", err)
		}
	}
	if w0.WorldVersion() <= before {
		t.Fatalf("the world's version did not grow: %d then %d", before, w0.WorldVersion())
	}

	// w1 comes back under its name and rank, at a new address.
	w1again, _ := world.Join(t, "w1", 1)
	for _, a := range []*core.Agent{w0, w1again, w5} {
		if got := names(a); got != "0:w0 1:w1 5:w5" {
			t.Fatalf("%s sees %q after w1 joined again", a.Self().Name, got)
		}
		callEcho(t, a, "w1")
		callEcho(t, w1again, a.Self().Name)
	}
}

func TestDynamicJoinRefusesANameOrRankInUse(t *testing.T) {
	world := coretest.NewDynamicWorld(echoHandlers())
	world.Join(t, "w0", 0)
	world.Join(t, "w1", 1)
	for _, tc := range []struct {
		name string
		rank int
		want string
	}{
		{"w1", 2, "RPC worker name w1 is not unique. Workers 1 and 2 share the same name."},
		{"other", 1, `rank 1 is taken by worker "w1"`},
	} {
		cfg, _ := world.Config(tc.name, tc.rank)
		a, err := core.Start(testctx.For(t), cfg)
		if err == nil {
			a.Shutdown(testctx.For(t), false)
			t.Fatalf("%s as rank %d joined", tc.name, tc.rank)
		}
		if !errors.Is(err, core.ErrRendezvous) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s as rank %d: %v, want %q", tc.name, tc.rank, err, tc.want)
		}
	}
}

func TestDynamicWorldDropsAWorkerWhoseProcessDied(t *testing.T) {
	world := coretest.NewDynamicWorld(echoHandlers())
	w0, _ := world.Join(t, "w0", 0)
	w1, _ := world.Join(t, "w1", 1)
	_, t2 := world.Join(t, "w2", 2)
	callEcho(t, w0, "w2")

	t2.Close() // w2's process ends without leaving: its streams and listener go
	waitFor(t, func() bool { return names(w0) == "0:w0 1:w1" && names(w1) == "0:w0 1:w1" })
	_, err := w1.CallRank(testctx.For(t), 2, "echo", core.Message{}).Result()
	if !errors.Is(err, core.ErrWorkerLeft) || !strings.Contains(err.Error(), `"w2"`) {
		t.Fatalf("call to the dead w2: %v", err)
	}
	// A restarted w2 takes its rank back.
	w2, _ := world.Join(t, "w2", 2)
	callEcho(t, w2, "w0")
	callEcho(t, w0, "w2")
}

func TestDynamicJoinTakesTheRankOfADeadProcessAtOnce(t *testing.T) {
	world := coretest.NewDynamicWorld(echoHandlers())
	world.Join(t, "w0", 0)
	_, t1 := world.Join(t, "w1", 1)
	t1.Close() // nobody had a stream to it, so nobody noticed
	w1, _ := world.Join(t, "w1", 1)
	callEcho(t, w1, "w0")
}

func TestCallsToALeavingWorkerFailNamingIt(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	handlers := echoHandlers()
	handlers["block"] = core.HandlerFunc(func(ctx context.Context, _ core.Message) (core.Message, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return core.Message{}, nil
	})
	defer close(release)
	world := coretest.NewDynamicWorld(handlers)
	w0, _ := world.Join(t, "w0", 0)
	w1, _ := world.Join(t, "w1", 1)
	pending := w0.CallAsync(testctx.For(t), "w1", "block", core.Message{})
	select { // the call is in w1's hands when it leaves
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not reach w1 within 10 s")
	}
	w1.Shutdown(testctx.For(t), false)
	done := make(chan error, 1)
	go func() { _, err := pending.Result(); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, core.ErrWorkerLeft) || !strings.Contains(err.Error(), `"w1"`) {
			t.Fatalf("the pending call ended with %v, want w1 named as having left", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call to a worker that left still waits after 5 s")
	}
}

func TestRRefForksOfALeaverAreReleased(t *testing.T) {
	var mu sync.Mutex
	dropped := map[wire.RRefID]bool{}
	world := coretest.NewDynamicWorld(echoHandlers())
	cfg, _ := world.Config("owner", 0)
	cfg.OnRRefDropped = func(id wire.RRefID) { mu.Lock(); dropped[id] = true; mu.Unlock() }
	owner, err := core.Start(testctx.For(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Shutdown(testctx.For(t), false)
	user, _ := world.Join(t, "user", 1)
	id, fork := user.NewRRefID(), user.NewRRefID()
	if err := user.AddFork(testctx.For(t), 0, id, fork, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return owner.OwnedRRefs() == 1 })
	user.Shutdown(testctx.For(t), false) // leaves without releasing its fork
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return dropped[id] })

	// The ids of a member that joins again under the same rank are new.
	again, _ := world.Join(t, "user", 1)
	if next := again.NewRRefID(); next == id || next == fork {
		t.Fatalf("a new member of rank 1 made id %v again", next)
	}
}

func TestDynamicWorldNeedsAStoreThatHoldsMembership(t *testing.T) {
	cfg := core.Config{Name: "w0", Rank: 0, InitMethod: "file://" + t.TempDir() + "/store", InitTimeout: time.Second}
	_, err := core.Start(testctx.For(t), cfg)
	if !errors.Is(err, core.ErrRendezvous) || !strings.Contains(err.Error(), "tcp:// or env://") {
		t.Fatalf("a dynamic world on a file store: %v", err)
	}
	static := rendezvous.NewMemStore(2)
	_, err = core.Start(testctx.For(t), core.Config{Name: "w0", Rank: 0, Store: static, InitTimeout: time.Second, Transport: coretest.NewDynamicWorld(nil).Network.Transport()})
	if err == nil || !strings.Contains(err.Error(), "fixed size 2") {
		t.Fatalf("a dynamic worker on a static world's store: %v", err)
	}
}

func TestDynamicWorldOverGRPC(t *testing.T) {
	init := fmt.Sprintf("tcp://127.0.0.1:%d", coretest.FreePort(t))
	start := func(name string, rank int) (*core.Agent, error) {
		a, err := core.Start(testctx.For(t), core.Config{
			Name: name, Rank: rank, InitMethod: init, ListenHost: "127.0.0.1",
			InitTimeout: 10 * time.Second, Handlers: echoHandlers(),
		})
		if err != nil {
			return nil, fmt.Errorf("join %s: %w", name, err)
		}
		t.Cleanup(func() { a.Shutdown(testctx.For(t), false) })
		return a, nil
	}
	join := func(name string, rank int) *core.Agent {
		a, err := start(name, rank)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	// A joiner may start before rank 0 (which hosts the store): it waits for it. Until rank 0
	// starts, the store's port is held here, and w2 is seen to knock at it.
	storeAddr := strings.TrimPrefix(init, "tcp://")
	placeholder, err := net.Listen("tcp", storeAddr)
	if err != nil {
		t.Fatal(err)
	}
	type started struct {
		a   *core.Agent
		err error
	}
	early := make(chan started, 1)
	go func() {
		a, err := start("w2", 2)
		early <- started{a, err}
	}()
	knocked := make(chan error, 1)
	go func() {
		conn, err := placeholder.Accept()
		if err == nil {
			conn.Close()
		}
		knocked <- err
	}()
	select {
	case err := <-knocked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("w2 did not try to reach the store within 10 s")
	}
	placeholder.Close()
	w0 := join("w0", 0)
	joined := <-early
	if joined.err != nil {
		t.Fatalf("the joiner that started before rank 0: %v", joined.err)
	}
	w2 := joined.a
	w1 := join("w1", 1)
	for _, a := range []*core.Agent{w0, w1, w2} {
		if got := names(a); got != "0:w0 1:w1 2:w2" {
			t.Fatalf("%s sees %q", a.Self().Name, got)
		}
		callEcho(t, a, "w0")
		callEcho(t, a, "w1")
		callEcho(t, a, "w2")
	}
	if err := w2.Shutdown(testctx.For(t), true); err != nil {
		t.Fatal(err)
	}
	if got := names(w1); got != "0:w0 1:w1" {
		t.Fatalf("w1 sees %q once w2 left", got)
	}
	w2 = join("w2", 2)
	callEcho(t, w1, "w2")
	callEcho(t, w2, "w1")
}

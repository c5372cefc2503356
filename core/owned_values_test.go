package core

import (
	"context"
	"errors"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// startPair starts two in-memory agents with handlers; tune, if set, changes their configs.
func startPair(t *testing.T, handlers map[string]Handler, tune ...func(*Config)) (a, b *Agent) {
	t.Helper()
	store, network := rendezvous.NewMemStore(2), transport.NewInmemNetwork()
	agents := make([]*Agent, 2)
	errs := make(chan error, 2)
	for i := range agents {
		go func() {
			cfg := Config{
				Name: []string{"w0", "w1"}[i], Rank: i, WorldSize: 2, Store: store, Transport: network.Transport(),
				Handlers: handlers, InitTimeout: 10 * time.Second,
			}
			for _, f := range tune {
				f(&cfg)
			}
			var err error
			agents[i], err = Start(testctx.For(t), cfg)
			errs <- err
		}()
	}
	for range agents {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, a := range agents {
			a.Shutdown(testctx.For(t), false)
		}
	})
	return agents[0], agents[1]
}

// remoteRequest is what a Python worker sends for remote(w1, remote_function(method), args).
func remoteRequest(t *testing.T, id wire.RRefID, method string, args ...any) Message {
	head, err := msgpack.Marshal([]any{id.Creator, id.Local, method})
	if err != nil {
		t.Fatal(err)
	}
	body, err := encodeValue(append([]any{}, args...)) // an array even when empty
	if err != nil {
		t.Fatal(err)
	}
	body.Payload = append(head, body.Payload...)
	return body
}

func TestRemoteValuesLiveOnTheirGoOwnerUntilTheLastForkGoes(t *testing.T) {
	handlers := map[string]Handler{
		"add":  Func(func(_ context.Context, a, b int) (int, error) { return a + b, nil }),
		"fail": Func(func(context.Context) (int, error) { return 0, errors.New("no value") }),
	}
	caller, owner := startPair(t, handlers)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	id := caller.NewRRefID()
	fork := wire.ForkID(caller.NewRRefID())
	if err := caller.AddFork(ctx, 1, id, fork, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := caller.Call(ctx, "w1", RemoteMethod, remoteRequest(t, id, "add", 2, 3)); err != nil {
		t.Fatalf("remote: %v", err)
	}
	fetch, _ := msgpack.Marshal([]any{id.Creator, id.Local})
	for range 2 { // a value can be fetched again
		resp, err := caller.Call(ctx, "w1", FetchMethod, Message{Payload: fetch})
		var v int
		if err != nil || msgpack.Unmarshal(resp.Payload, &v) != nil || v != 5 {
			t.Fatalf("fetch: %v, %v", v, err)
		}
	}
	if n := owner.OwnedValues(); n != 1 {
		t.Fatalf("the owner keeps %d values, want 1", n)
	}
	if err := caller.ReleaseFork(1, id, fork); err != nil {
		t.Fatal(err)
	}
	caller.flushRefOps(ctx) // releases ride on calls, or go on their own when flushed
	deadline := time.Now().Add(5 * time.Second)
	for owner.OwnedValues() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := owner.OwnedValues(); n != 0 {
		t.Fatalf("the owner keeps %d values after the last fork went, want 0", n)
	}
	if _, err := caller.Call(ctx, "w1", FetchMethod, Message{Payload: fetch}); err == nil || !strings.Contains(err.Error(), "has no RRef") {
		t.Fatalf("fetch of a dropped value: %v", err)
	}

	cases := []struct {
		name, method, want string
	}{
		{"a failing handler", "fail", "no value"},
		{"an unknown handler", "nope", "serves no such function"},
		{"a handler of the core's own", FetchMethod, "serves no such function"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := caller.NewRRefID()
			if err := caller.AddFork(ctx, 1, id, wire.ForkID(caller.NewRRefID()), 0); err != nil {
				t.Fatal(err)
			}
			_, err := caller.Call(ctx, "w1", RemoteMethod, remoteRequest(t, id, c.method))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("remote: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// remote() requests are taken only from the RRef's creator, once its fork is registered: a
// value no fork holds would be kept forever.
func TestRemoteValuesNeedTheCreatorsFork(t *testing.T) {
	handlers := map[string]Handler{"one": Func(func(context.Context) (int, error) { return 1, nil })}
	caller, owner := startPair(t, handlers)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cases := []struct {
		name string
		id   wire.RRefID
		fork bool
	}{
		{"no fork", caller.NewRRefID(), false},
		{"another worker's id", wire.RRefID{Creator: 1, Local: 99}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.fork {
				if err := caller.AddFork(ctx, 1, c.id, wire.ForkID(caller.NewRRefID()), 0); err != nil {
					t.Fatal(err)
				}
			}
			_, err := caller.Call(ctx, "w1", RemoteMethod, remoteRequest(t, c.id, "one"))
			if err == nil || !strings.Contains(err.Error(), "with a fork registered here") {
				t.Fatalf("err %v, want a refusal", err)
			}
		})
	}
	if n := owner.OwnedValues(); n != 0 {
		t.Fatalf("the owner keeps %d values, want 0", n)
	}
}

// A caller that stops waiting for a remote() creation frees its slot in the owner's service
// at once; the handler's context ends when the RRef is dropped.
func TestAnAbandonedRemoteCreationHoldsNoSlot(t *testing.T) {
	stopped := make(chan struct{}, 4)
	handlers := map[string]Handler{
		"wait": Func(func(ctx context.Context) (int, error) { <-ctx.Done(); stopped <- struct{}{}; return 0, ctx.Err() }),
		"one":  Func(func(context.Context) (int, error) { return 1, nil }),
	}
	var dropped []wire.RRefID
	caller, owner := startPair(t, handlers, func(c *Config) {
		c.MaxServedPerCaller = 2
		c.OnRRefDropped = func(id wire.RRefID) { dropped = append(dropped, id) }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var forks []wire.ForkID
	var ids []wire.RRefID
	for range 2 {
		id, fork := caller.NewRRefID(), wire.ForkID(caller.NewRRefID())
		if err := caller.AddFork(ctx, 1, id, fork, 0); err != nil {
			t.Fatal(err)
		}
		short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := caller.Call(short, "w1", RemoteMethod, remoteRequest(t, id, "wait"))
		stop()
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("remote of a handler that waits: %v, want a timeout", err)
		}
		ids, forks = append(ids, id), append(forks, fork)
	}
	// Both of the caller's slots were taken by the abandoned creations if they were held.
	if _, err := caller.Call(ctx, "w1", "one", Message{Payload: []byte{0x90}}); err != nil {
		t.Fatalf("a call after two abandoned creations: %v", err)
	}
	for i := range ids {
		if err := caller.ReleaseFork(1, ids[i], forks[i]); err != nil {
			t.Fatal(err)
		}
	}
	caller.flushRefOps(ctx)
	for range 2 {
		select {
		case <-stopped:
		case <-ctx.Done():
			t.Fatal("the handlers of dropped RRefs were not stopped")
		}
	}
	if owner.OwnedValues() != 0 || len(dropped) != 0 {
		t.Fatalf("owner keeps %d values; OnRRefDropped saw %v (values kept by the core are not the callback's)", owner.OwnedValues(), dropped)
	}
}

// TestAReleaseBetweenTheForkCheckAndTheSlotLeavesNoValue: a release of the new RRef's only
// fork applied after remoteHandler found the fork but before it published the value's slot
// found nothing to drop; the handler looks again and drops the slot, instead of keeping a value
// nothing would ever release.
func TestAReleaseBetweenTheForkCheckAndTheSlotLeavesNoValue(t *testing.T) {
	handlers := map[string]Handler{"one": Func(func(context.Context) (int, error) { return 1, nil })}
	caller, owner := startPair(t, handlers)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := caller.NewRRefID()
	fork := wire.ForkID(caller.NewRRefID())
	if err := caller.AddFork(ctx, 1, id, fork, 0); err != nil {
		t.Fatal(err)
	}
	owner.beforeCreate = func(wire.RRefID) {
		owner.applyRefOps([]wire.RefOp{{Kind: wire.RefRelease, RRef: id, Fork: fork, Holder: caller.self.ID, HolderEpoch: caller.epoch}})
	}
	_, err := caller.Call(ctx, "w1", RemoteMethod, remoteRequest(t, id, "one"))
	if err == nil || !strings.Contains(err.Error(), "released before it was made") {
		t.Fatalf("remote() whose fork was released meanwhile: err = %v", err)
	}
	if n := owner.OwnedValues(); n != 0 {
		t.Fatalf("the owner keeps %d values no fork holds", n)
	}
}

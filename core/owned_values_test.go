package core

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// startPair starts two in-memory agents with handlers.
func startPair(t *testing.T, handlers map[string]Handler) (a, b *Agent) {
	t.Helper()
	store, network := rendezvous.NewMemStore(2), transport.NewInmemNetwork()
	agents := make([]*Agent, 2)
	errs := make(chan error, 2)
	for i := range agents {
		go func() {
			var err error
			agents[i], err = Start(context.Background(), Config{
				Name: []string{"w0", "w1"}[i], Rank: i, WorldSize: 2, Store: store, Transport: network.Transport(),
				Handlers: handlers, InitTimeout: 10 * time.Second,
			})
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
			a.Shutdown(context.Background(), false)
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
			_, err := caller.Call(ctx, "w1", RemoteMethod, remoteRequest(t, id, c.method))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("remote: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

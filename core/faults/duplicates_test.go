package faults

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestDuplicatedFramesChangeNothing: a link that delivers requests, replies and reference
// operations twice leaves every call its own reply and the owner's counts right.
func TestDuplicatedFramesChangeNothing(t *testing.T) {
	var runs atomic.Int64
	handlers := map[string]core.Handler{
		"echo": echo["echo"],
		"count": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
			runs.Add(1)
			return req, nil
		}),
	}
	network := transport.NewInmemNetwork()
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers, Network: network})
	caller, owner := c.Agents[0], c.Agents[1]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := caller.Call(ctx, "w1", "echo", core.Message{}); err != nil { // streams are up
		t.Fatal(err)
	}
	twice := network.Inject(transport.Fault{Match: func(f *wire.Frame) bool {
		return f.Kind == wire.FrameRequest || f.Kind == wire.FrameResponse || f.Kind == wire.FrameRefs
	}, Duplicate: true})
	defer twice.Remove()
	for i := range 20 {
		want := fmt.Sprint(i)
		resp, err := caller.Call(ctx, "w1", "count", core.Message{Payload: []byte(want)})
		if err != nil || string(resp.Payload) != want {
			t.Fatalf("call %d: %q, %v", i, resp.Payload, err)
		}
	}
	var ids, forks []wire.RRefID
	for range 10 {
		id, fork := caller.NewRRefID(), caller.NewRRefID()
		if err := caller.AddFork(ctx, 1, id, fork, 0); err != nil {
			t.Fatal(err)
		}
		ids, forks = append(ids, id), append(forks, fork)
	}
	if _, err := caller.Call(ctx, "w1", "echo", core.Message{}); err != nil {
		t.Fatal(err)
	}
	if n := owner.OwnedRRefs(); n != 10 {
		t.Fatalf("the owner tracks %d RRefs after 10 forks registered twice over, want 10", n)
	}
	for i := range ids {
		caller.ReleaseFork(1, ids[i], forks[i])
	}
	waitUntil(ctx, t, "the owner dropped every RRef", func() bool { return owner.OwnedRRefs() == 0 })
	if twice.Hits() == 0 {
		t.Fatal("the fault duplicated nothing")
	}
	t.Logf("20 calls ran their handler %d times under duplicated requests", runs.Load())
}

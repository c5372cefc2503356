package faults

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestRepliesDelayedSecondsStillComplete: a callee whose replies take 3 s to arrive (a loaded
// host, a slow link) is slow, not lost: every call completes with its reply, none fails, and
// the callee stays in the world.
func TestRepliesDelayedSecondsStillComplete(t *testing.T) {
	const delay = 3 * time.Second
	network := transport.NewInmemNetwork()
	c := coretest.New(t, 2, coretest.Options{Handlers: echo, Network: network})
	caller, callee := c.Agents[0], c.Agents[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := caller.Call(ctx, "w1", "echo", core.Message{}); err != nil { // the stream is up
		t.Fatal(err)
	}
	slow := network.Inject(transport.Fault{From: callee.Self().Addr, To: caller.Self().Addr, Match: func(f *wire.Frame) bool { return f.Kind == wire.FrameResponse }, Delay: delay})
	defer slow.Remove()
	started := time.Now()
	var calls []*core.CallFuture
	for i := range 4 {
		calls = append(calls, caller.CallAsync(ctx, "w1", "echo", core.Message{Payload: []byte{byte(i)}}))
	}
	for i, f := range calls {
		resp, err := f.Wait(ctx)
		if err != nil || len(resp.Payload) != 1 || resp.Payload[0] != byte(i) {
			t.Fatalf("call %d: %v, %v", i, resp.Payload, err)
		}
	}
	if took := time.Since(started); took < delay {
		t.Fatalf("the replies came after %v, before the fault's %v: the test did not delay them", took, delay)
	}
	if slow.Hits() < int64(len(calls)) {
		t.Fatalf("the fault delayed %d replies of %d", slow.Hits(), len(calls))
	}
	if _, err := caller.Call(ctx, "w1", "echo", core.Message{}); err != nil {
		t.Fatalf("a call after the slow ones: %v", err)
	}
	if _, ok := caller.Worker("w1"); !ok {
		t.Fatal("the slow callee was dropped from the caller's world")
	}
}

// TestACutDuringTheShutdownBarrierEndsNoOneHanging: a worker whose graceful shutdown waits for
// its own call to a peer when the link to that peer is cut goes on (the call fails, naming
// the peer), and every worker's shutdown returns.
func TestACutDuringTheShutdownBarrierEndsNoOneHanging(t *testing.T) {
	var entered atomic.Int64
	release := make(chan struct{})
	handlers := map[string]core.Handler{
		"block": blocking(&entered, release),
	}
	defer close(release)
	network := transport.NewInmemNetwork()
	c := coretest.New(t, 3, coretest.Options{Handlers: handlers, Network: network})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pending := c.Agents[0].CallAsync(context.Background(), "w1", "block", core.Message{})
	waitUntil(ctx, t, "the call is being served", func() bool { return entered.Load() == 1 })
	done := make(chan error, 3)
	for _, a := range c.Agents {
		go func() { done <- a.Shutdown(ctx, true) }()
	}
	time.Sleep(200 * time.Millisecond) // into the barrier: w0 waits for its own call there
	network.Partition(c.Agents[0].Self().Addr, c.Agents[1].Self().Addr)
	if _, err := pending.Wait(ctx); err == nil {
		t.Fatal("the call across the cut completed")
	}
	for range c.Agents {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("a worker's graceful shutdown still waits after the cut")
		}
	}
}

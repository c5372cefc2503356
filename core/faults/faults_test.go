// Package faults drives test worlds through failures: workers that vanish mid-run.
package faults

import (
	"context"
	"errors"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

var echo = map[string]core.Handler{
	"echo": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) { return req, nil }),
}

// TestSurvivorsShutDownGracefully: a worker vanishes (its agent closes without the barrier);
// the others' graceful shutdown completes, naming it, instead of waiting for it.
func TestSurvivorsShutDownGracefully(t *testing.T) {
	tests := []struct {
		name string
		gone int
	}{
		{name: "a worker", gone: 1},
		{name: "the store's host", gone: 0},
	}
	for _, tt := range tests {
		for _, grpc := range []bool{false, true} {
			t.Run(tt.name+map[bool]string{false: "/inmem", true: "/grpc"}[grpc], func(t *testing.T) {
				c := coretest.New(t, 3, coretest.Options{GRPC: grpc, Handlers: echo})
				for _, a := range c.Agents {
					for _, w := range a.Workers() {
						if _, err := a.Call(testctx.For(t), w.Name, "echo", core.Message{}); err != nil {
							t.Fatal(err)
						}
					}
				}
				c.Agents[tt.gone].Shutdown(testctx.For(t), false)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var wg sync.WaitGroup
				for i, a := range c.Agents {
					if i == tt.gone {
						continue
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := a.Shutdown(ctx, true); err != nil {
							t.Errorf("w%d: %v", i, err)
						}
						gone := a.Gone()
						if len(gone) != 1 || gone[0].ID != tt.gone {
							t.Errorf("w%d found %v gone, want only w%d", i, gone, tt.gone)
						}
					}()
				}
				wg.Wait()
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					t.Fatal("graceful shutdown waited for a worker that is gone")
				}
			})
		}
	}
}

// TestForksOfAGoneWorkerAreDropped: values referenced only by a worker that died are dropped
// by their owner, not kept forever.
func TestForksOfAGoneWorkerAreDropped(t *testing.T) {
	dropped := make(chan wire.RRefID, 1)
	cfgs := coretest.Configs(t, 2, coretest.Options{GRPC: true, Handlers: echo})
	cfgs[0].OnRRefDropped = func(id wire.RRefID) { dropped <- id }
	c := coretest.Start(t, cfgs)
	owner, user := c.Agents[0], c.Agents[1]
	id, fork := user.NewRRefID(), user.NewRRefID()
	if err := user.AddFork(testctx.For(t), 0, id, fork, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := user.Call(testctx.For(t), "w0", "echo", core.Message{}); err != nil {
		t.Fatal(err) // the fork is registered once this call, sent after it, is answered
	}
	if owner.OwnedRRefs() != 1 {
		t.Fatalf("owner tracks %d RRefs, want 1", owner.OwnedRRefs())
	}
	user.Shutdown(testctx.For(t), false)
	select {
	case got := <-dropped:
		if got != id {
			t.Fatalf("dropped %v, want %v", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the owner kept a value held only by a worker that is gone")
	}
	if owner.OwnedRRefs() != 0 {
		t.Fatalf("owner still tracks %d RRefs", owner.OwnedRRefs())
	}
}

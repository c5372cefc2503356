package faults

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestTokenKeepsStrangersOut: in a world with a token, a peer without it, or with a wrong one,
// is refused by workers and by the store, and nothing it sends reaches a handler.
func TestTokenKeepsStrangersOut(t *testing.T) {
	var served atomic.Int64
	handlers := map[string]core.Handler{
		"count": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
			served.Add(1)
			return req, nil
		}),
	}
	cfgs := coretest.Configs(t, 2, coretest.Options{GRPC: true, Handlers: handlers, Token: "s3cret"})
	agents := coretest.Start(t, cfgs).Agents
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := agents[0].Call(ctx, "w1", "count", core.Message{}); err != nil {
		t.Fatalf("a call inside the world: %v", err)
	}
	for _, token := range []string{"", "wrong"} {
		tr, addr, err := coretest.NetworkTransport(agents[1], token, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tr.Dial(ctx, addr)
		if err == nil {
			s.Send(wire.HelloFrame("w0", 0, 0))
			s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "count"})
			_, err = s.Recv()
		}
		if err == nil || !strings.Contains(err.Error(), "this world requires its token (TENSORPLAY_RPC_TOKEN)") {
			t.Errorf("token %q: err = %v, want the worker's refusal for want of the world's token", token, err)
		}
		tr.Close()
	}
	if n := served.Load(); n != 1 {
		t.Fatalf("handlers ran %d times, want only the world's own call", n)
	}
	// A worker with the wrong token cannot join through the store either.
	intruder := cfgs[1]
	intruder.Name, intruder.Token, intruder.InitTimeout = "intruder", "wrong", 2*time.Second
	_, err := core.Start(ctx, intruder)
	if !errors.Is(err, core.ErrRendezvous) || !strings.Contains(err.Error(), "refused this worker: this world requires its token (TENSORPLAY_RPC_TOKEN)") {
		t.Fatalf("err = %v, want the store's refusal of the intruder for want of the world's token", err)
	}
}

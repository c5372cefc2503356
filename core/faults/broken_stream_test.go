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
	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// brokenStreamBound is what "at once" means for calls pending on a stream that broke: far more
// than failing them takes, far less than any timeout a caller would wait.
const brokenStreamBound = 500 * time.Millisecond

// TestABrokenStreamFailsItsPendingCallsAtOnce: calls pending on a stream to a live peer when
// the stream breaks fail at once, each naming the worker, and the next call opens a new stream.
func TestABrokenStreamFailsItsPendingCallsAtOnce(t *testing.T) {
	var serving atomic.Int64
	release := make(chan struct{})
	defer close(release)
	handlers := map[string]core.Handler{
		"echo":  echo["echo"],
		"block": blocking(&serving, release),
	}
	network := transport.NewInmemNetwork()
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers, Network: network})
	caller, callee := c.Agents[0], c.Agents[1]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const pending = 5
	var calls []*core.CallFuture
	for range pending {
		calls = append(calls, caller.CallAsync(context.Background(), "w1", "block", core.Message{}))
	}
	waitUntil(ctx, t, "every call is being served", func() bool { return serving.Load() == pending })
	broke := time.Now()
	network.Break(caller.Self().Addr, callee.Self().Addr)
	for i, f := range calls {
		select {
		case <-f.Done():
		case <-time.After(brokenStreamBound):
			t.Fatalf("call %d still pending %v after its stream broke", i, time.Since(broke).Round(time.Millisecond))
		}
		if _, err := f.Result(); !errors.Is(err, core.ErrPeerLost) || !strings.Contains(err.Error(), `"w1"`) {
			t.Fatalf("call %d: err = %v, want the peer named as lost", i, err)
		}
	}
	if took := time.Since(broke); took > brokenStreamBound {
		t.Fatalf("the pending calls failed %v after their stream broke", took.Round(time.Millisecond))
	}
	if _, err := caller.Call(ctx, "w1", "echo", core.Message{Payload: []byte("again")}); err != nil {
		t.Fatalf("the next call: %v", err)
	}
}

// blocking is a handler that counts the calls it is serving in entered and answers each once
// release is closed (or its call's context ends).
func blocking(entered *atomic.Int64, release <-chan struct{}) core.Handler {
	return core.HandlerFunc(func(ctx context.Context, req core.Message) (core.Message, error) {
		entered.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return req, nil
	})
}

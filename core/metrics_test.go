package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

func TestMetricsCountTrafficByPeer(t *testing.T) {
	handlers := map[string]core.Handler{
		"echo": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) { return req, nil }),
		"fail": core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) { return core.Message{}, errors.New("no") }),
		"wait": core.HandlerFunc(func(ctx context.Context, _ core.Message) (core.Message, error) {
			<-ctx.Done()
			return core.Message{}, ctx.Err()
		}),
	}
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := c.Agents[0], c.Agents[1]
	for range 3 {
		if _, err := a.Call(ctx, "w1", "echo", core.Message{Payload: make([]byte, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Call(ctx, "w1", "fail", core.Message{Payload: make([]byte, 10)}); err == nil {
		t.Fatal("fail did not fail")
	}
	short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err := a.Call(short, "w1", "wait", core.Message{})
	stop()
	if !errors.Is(err, core.ErrTimeout) {
		t.Fatalf("wait: %v", err)
	}

	peer := func(m core.Metrics, name string) core.PeerMetrics {
		for _, p := range m.Peers {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no peer %s in %+v", name, m)
		return core.PeerMetrics{}
	}
	sent := peer(a.Metrics(), "w1")
	if sent.CallsSent != 5 || sent.InFlight != 0 || sent.BytesSent != 310 || sent.BytesReceived != 300 ||
		sent.Errors["remote"] != 1 || sent.Errors["timeout"] != 1 || sent.Errors["peer_lost"] != 0 {
		t.Fatalf("w0's view of w1: %+v", sent)
	}
	if p50, p99 := sent.LatencyUs["p50"], sent.LatencyUs["p99"]; p50 <= 0 || p99 < p50 || p99 < 16384 {
		t.Fatalf("latency: %v (the timed-out call took 20 ms, so p99 >= 16384 us)", sent.LatencyUs)
	}
	// The callee counts what it served once each request was read (the one that timed out too).
	deadline := time.Now().Add(5 * time.Second)
	for peer(b.Metrics(), "w0").CallsServed < 5 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	served := peer(b.Metrics(), "w0")
	if served.CallsServed != 5 || served.BytesReceived != 310 || served.CallsSent != 0 {
		t.Fatalf("w1's view of w0: %+v", served)
	}
}

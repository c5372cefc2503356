package faults

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// slowHandler is a blocking handler that runs at most executors calls at a time, as a pool of
// executor threads would: calls arrive far faster than it serves them.
type slowHandler struct {
	executors chan struct{}
	inService atomic.Int64 // taken off the stream and not yet answered
	peak      atomic.Int64
}

func (h *slowHandler) handler() core.HandlerFunc {
	return func(ctx context.Context, req core.Message) (core.Message, error) {
		n := h.inService.Add(1)
		defer h.inService.Add(-1)
		for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
		}
		select {
		case h.executors <- struct{}{}:
		case <-ctx.Done():
			return core.Message{}, ctx.Err()
		}
		defer func() { <-h.executors }()
		return core.Message{Payload: append([]byte(nil), req.Payload...)}, nil
	}
}

// TestAFloodOfCallsIsBounded: three peers flood a worker with 200,000 small calls, far faster
// than it serves them. The calls each caller has in the worker stay bounded (the rest wait in
// flow control, not in memory), goroutines stay bounded, and every call is answered with its
// own payload: nothing is lost.
func TestAFloodOfCallsIsBounded(t *testing.T) {
	const (
		callers        = 3
		total          = 200_000
		perCaller      = (total + callers - 1) / callers
		servedLimit    = 256
		outstandingCap = 4096 // calls each caller keeps in flight
	)
	h := &slowHandler{executors: make(chan struct{}, 4)}
	cfgs := coretest.Configs(t, callers+1, coretest.Options{GRPC: true})
	callee := cfgs[callers].Name
	cfgs[callers].Handlers = map[string]core.Handler{"serve": h.handler()}
	cfgs[callers].MaxServedPerCaller = servedLimit
	c := coretest.Start(t, cfgs)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Streams are dialed before the flood (and counted in the base): the flood is about what
	// the worker holds, not about dialing on a loaded machine.
	for i := 0; i < callers; i++ {
		if _, err := c.Agents[i].Call(ctx, callee, "serve", core.Message{Payload: []byte("warm")}); err != nil {
			t.Fatal(err)
		}
	}

	baseGoroutines := runtime.NumGoroutine()
	peakGoroutines := coretest.Peak(5*time.Millisecond, func() int64 { return int64(runtime.NumGoroutine()) })
	var answered, wrong atomic.Int64
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots := make(chan struct{}, outstandingCap)
			var pending sync.WaitGroup
			var failed atomic.Pointer[error]
			for k := 0; k < perCaller && failed.Load() == nil; k++ {
				slots <- struct{}{}
				payload := binary.LittleEndian.AppendUint64(nil, uint64(i*perCaller+k))
				f := c.Agents[i].CallAsync(ctx, callee, "serve", core.Message{Payload: payload})
				pending.Add(1)
				f.AfterDone(func() {
					defer pending.Done()
					defer func() { <-slots }()
					resp, err := f.Result()
					switch {
					case err != nil:
						failed.CompareAndSwap(nil, &err)
					case string(resp.Payload) != string(payload):
						wrong.Add(1)
					default:
						answered.Add(1)
					}
				})
			}
			pending.Wait()
			if err := failed.Load(); err != nil {
				errs <- fmt.Errorf("caller %d: %w", i, *err)
			}
		}()
	}
	wg.Wait()
	goroutines := peakGoroutines()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := answered.Load(); got != callers*perCaller || wrong.Load() != 0 {
		t.Fatalf("%d calls answered rightly and %d wrongly, want all %d right", got, wrong.Load(), callers*perCaller)
	}
	if peak := h.peak.Load(); peak > callers*servedLimit {
		t.Fatalf("the worker took %d calls off its streams at once, over %d callers x %d", peak, callers, servedLimit)
	}
	// Without the bound a flooded worker has a goroutine per call its callers sent (here up to
	// 3 x 4096); with it, one per call in service, and as many again ending while new ones
	// start.
	if peak := goroutines; peak > int64(baseGoroutines+2*callers*servedLimit+200) {
		t.Fatalf("goroutines peaked at %d (from %d before the flood)", peak, baseGoroutines)
	}
	t.Logf("peak in service %d, peak goroutines %d (base %d)", h.peak.Load(), goroutines, baseGoroutines)
}

// TestCallsInServiceAreBoundedPerCallerNotPerStream: a caller that opens more streams does not
// get more calls into service; MaxServedPerCaller counts all of its streams together.
func TestCallsInServiceAreBoundedPerCallerNotPerStream(t *testing.T) {
	release := make(chan struct{})
	var running atomic.Int64
	started := make(chan struct{}, 2)
	block := core.HandlerFunc(func(ctx context.Context, _ core.Message) (core.Message, error) {
		running.Add(1)
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return core.Message{}, nil
	})
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, Handlers: map[string]core.Handler{"block": block}})
	cfgs[1].MaxServedPerCaller = 1
	c := coretest.Start(t, cfgs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, addr, err := coretest.NetworkTransport(c.Agents[1], "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var streams []transport.Stream
	for i := 0; i < 2; i++ {
		s, err := tr.Dial(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		s.Send(wire.HelloFrame("w0", 0, 0))
		s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: uint64(i + 1), Method: "block"})
		streams = append(streams, s)
	}
	// The first call is in service; the second, read off its stream too, must wait for its
	// slot. Another caller is served meanwhile (its slots are its own).
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("no call of the caller went into service")
	}
	// w1 read the second request and holds it for want of a slot: it did not go into service.
	for {
		w0 := metricsOfW0(c.Agents[1])
		if w0.CallsWaiting == 1 {
			break
		}
		if running.Load() > 1 || ctx.Err() != nil {
			t.Fatalf("%d calls of one caller in service over two streams, %d waiting for a slot; want 1 and 1 (w1 read %d requests)", running.Load(), w0.CallsWaiting, w0.CallsServed)
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Agents[2].Call(ctx, "w1", "missing", core.Message{}); !errors.Is(err, core.ErrNoHandler) {
		t.Fatalf("another caller: err = %v, want ErrNoHandler", err)
	}
	if n := running.Load(); n != 1 {
		t.Fatalf("%d calls of one caller in service over two streams, want 1", n)
	}
	close(release)
	for _, s := range streams {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	if n := running.Load(); n != 2 {
		t.Fatalf("%d calls ran, want both once a slot was free", n)
	}
	if n := metricsOfW0(c.Agents[1]).CallsWaiting; n != 0 {
		t.Fatalf("%d calls of w0 still counted as waiting for a slot after both ran", n)
	}
}

// metricsOfW0 is what worker a counts of w0.
func metricsOfW0(a *core.Agent) core.PeerMetrics {
	for _, p := range a.Metrics().Peers {
		if p.Name == "w0" {
			return p
		}
	}
	return core.PeerMetrics{}
}

package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

// testHandlers is what every agent of these tests serves.
func testHandlers(release <-chan struct{}) map[string]core.Handler {
	return map[string]core.Handler{
		"echo": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
			return req, nil
		}),
		"fail": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
			return core.Message{}, core.NewRemoteError("it failed: "+string(req.Payload), core.Message{Payload: []byte("detail")})
		}),
		"block": core.HandlerFunc(func(ctx context.Context, _ core.Message) (core.Message, error) {
			select {
			case <-release:
				return core.Message{Payload: []byte("released")}, nil
			case <-ctx.Done():
				return core.Message{}, ctx.Err()
			}
		}),
	}
}

func forEachTransport(t *testing.T, test func(t *testing.T, opts coretest.Options)) {
	for _, grpc := range []bool{false, true} {
		name := map[bool]string{false: "inmem", true: "grpc"}[grpc]
		t.Run(name, func(t *testing.T) { test(t, coretest.Options{GRPC: grpc}) })
	}
}

func TestCalls(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		c := coretest.New(t, 3, opts)
		big := bytes.Repeat([]byte("x"), 5<<20)
		tests := []struct {
			name, from, to, method string
			req                    core.Message
			want                   string
			wantErr                error
			wantRemote             string
		}{
			{name: "echo to a peer", from: "w0", to: "w1", method: "echo", req: core.Message{Payload: []byte("hi")}, want: "hi"},
			{name: "echo to self", from: "w2", to: "w2", method: "echo", req: core.Message{Payload: []byte("me")}, want: "me"},
			{name: "buffers travel", from: "w1", to: "w2", method: "echo", req: core.Message{Payload: []byte("p"), Buffers: [][]byte{[]byte("b1"), {}, []byte("b3")}}, want: "p"},
			{name: "payload over gRPC's default limit", from: "w1", to: "w0", method: "echo", req: core.Message{Payload: big}, want: string(big)},
			{name: "handler error", from: "w0", to: "w2", method: "fail", req: core.Message{Payload: []byte("x")}, wantRemote: "it failed: x"},
			{name: "no handler", from: "w0", to: "w1", method: "nope", wantErr: core.ErrNoHandler},
			{name: "unknown worker", from: "w0", to: "w9", method: "echo", wantErr: core.ErrUnknownWorker},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				a := c.Agents[tt.from[1]-'0']
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := a.Call(ctx, tt.to, tt.method, tt.req)
				var re *core.RemoteError
				switch {
				case tt.wantErr != nil:
					if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.to) {
						t.Fatalf("err = %v, want %v naming %s", err, tt.wantErr, tt.to)
					}
				case tt.wantRemote != "":
					if !errors.As(err, &re) || re.Message != tt.wantRemote || re.Worker != tt.to || string(re.Payload.Payload) != "detail" {
						t.Fatalf("err = %#v, want remote error %q from %s", err, tt.wantRemote, tt.to)
					}
				case err != nil:
					t.Fatal(err)
				case string(resp.Payload) != tt.want:
					t.Fatalf("got %d bytes, want %d", len(resp.Payload), len(tt.want))
				case len(resp.Buffers) != len(tt.req.Buffers):
					t.Fatalf("got %d buffers, want %d", len(resp.Buffers), len(tt.req.Buffers))
				}
				for i := range resp.Buffers {
					if !bytes.Equal(resp.Buffers[i], tt.req.Buffers[i]) {
						t.Fatalf("buffer %d = %q, want %q", i, resp.Buffers[i], tt.req.Buffers[i])
					}
				}
			})
		}
	})
}

func TestManyConcurrentCalls(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		c := coretest.New(t, 4, opts)
		var wg sync.WaitGroup
		errs := make(chan error, 400)
		for i := 0; i < 400; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				from, to := c.Agents[i%4], fmt.Sprintf("w%d", (i/4)%4)
				want := fmt.Sprint(i)
				resp, err := from.Call(testctx.For(t), to, "echo", core.Message{Payload: []byte(want)})
				if err == nil && string(resp.Payload) != want {
					err = fmt.Errorf("call %d got %q", i, resp.Payload)
				}
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestDeadline(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		release := make(chan struct{})
		defer close(release)
		opts.Handlers = testHandlers(release)
		c := coretest.New(t, 2, opts)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Agents[0].Call(ctx, "w1", "block", core.Message{})
		if !errors.Is(err, core.ErrTimeout) || !strings.Contains(err.Error(), `"w1"`) {
			t.Fatalf("err = %v, want a timeout naming w1", err)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Fatalf("timeout fired after %v", waited)
		}
		// The callee still serves others while the blocked handler waits.
		if _, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{}); err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithCancel(testctx.For(t))
		f := c.Agents[0].CallAsync(cctx, "w1", "block", core.Message{})
		ccancel()
		if _, err := f.Result(); !errors.Is(err, core.ErrCanceled) {
			t.Fatalf("err = %v, want canceled", err)
		}
	})
}

// TestNonGracefulShutdownFailsPendingSelfCalls: calls a worker made to itself that are still
// being served fail at a non-graceful shutdown, as calls to peers do (they stayed pending for
// good when their handler did not return).
func TestNonGracefulShutdownFailsPendingSelfCalls(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	handlers := testHandlers(release)
	// As a request queued for Python's threads is: nothing ends it but its handler.
	handlers["stuck"] = core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
		<-release
		return core.Message{}, nil
	})
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers})
	var pending []*core.CallFuture
	for range 3 {
		pending = append(pending, c.Agents[0].CallAsync(context.Background(), "w0", "stuck", core.Message{}))
	}
	if _, err := c.Agents[0].Call(testctx.For(t), "w0", "echo", core.Message{}); err != nil {
		t.Fatal(err)
	}
	c.Agents[0].Shutdown(testctx.For(t), false)
	for _, f := range pending {
		select {
		case <-f.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a call to itself is still pending after a non-graceful shutdown")
		}
		if _, err := f.Result(); !errors.Is(err, core.ErrShutdown) || !strings.Contains(err.Error(), `"w0" (itself)`) {
			t.Fatalf("err = %v, want shut down naming w0", err)
		}
	}
}

func TestPeerLostFailsPendingCalls(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		release := make(chan struct{})
		defer close(release)
		opts.Handlers = testHandlers(release)
		c := coretest.New(t, 3, opts)
		var pending []*core.CallFuture
		for i := 0; i < 5; i++ {
			pending = append(pending, c.Agents[0].CallAsync(testctx.For(t), "w1", "block", core.Message{}))
		}
		// Make sure the calls reached w1 before it goes away.
		if _, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{}); err != nil {
			t.Fatal(err)
		}
		c.Agents[1].Shutdown(testctx.For(t), false)
		for _, f := range pending {
			select {
			case <-f.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("a call to a lost peer is still pending")
			}
			if _, err := f.Result(); !errors.Is(err, core.ErrPeerLost) || !strings.Contains(err.Error(), `"w1"`) {
				t.Fatalf("err = %v, want peer lost naming w1", err)
			}
		}
		if _, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{}); !errors.Is(err, core.ErrPeerLost) {
			t.Fatalf("new call to the lost peer: err = %v, want peer lost", err)
		}
		if _, err := c.Agents[0].Call(testctx.For(t), "w2", "echo", core.Message{}); err != nil {
			t.Fatalf("survivors must keep calling each other: %v", err)
		}
	})
}

func TestGracefulShutdownIsABarrier(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		c := coretest.New(t, 3, opts)
		// w2 enters its Shutdown only once every call it makes has been answered; closing
		// w2Leaving just before is the event the others' Shutdown must not return ahead of.
		w2Leaving := make(chan struct{})
		var wg sync.WaitGroup
		for i, a := range c.Agents[:2] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := a.Shutdown(testctx.For(t), true); err != nil {
					t.Errorf("shutdown w%d: %v", i, err)
				}
				select {
				case <-w2Leaving:
				default:
					t.Errorf("w%d's Shutdown returned while w2 was still calling it, before w2 entered its own Shutdown", i)
				}
			}()
		}
		// w2 calls the others while both wait in their Shutdown.
		waitFor(t, func() bool { return c.Agents[0].ShuttingDown() && c.Agents[1].ShuttingDown() })
		for j := 0; j < 20; j++ {
			want := fmt.Sprint(j)
			resp, err := c.Agents[2].Call(testctx.For(t), fmt.Sprintf("w%d", j%2), "echo", core.Message{Payload: []byte(want)})
			if err != nil || string(resp.Payload) != want {
				t.Errorf("call %d to w%d during its shutdown: %q, %v", j, j%2, resp.Payload, err)
				break
			}
		}
		close(w2Leaving)
		if err := c.Agents[2].Shutdown(testctx.For(t), true); err != nil {
			t.Errorf("shutdown w2: %v", err)
		}
		wg.Wait()
		if _, err := c.Agents[0].Call(testctx.For(t), "w0", "echo", core.Message{}); !errors.Is(err, core.ErrShutdown) {
			t.Fatalf("call after shutdown: err = %v, want ErrShutdown", err)
		}
		if err := c.Agents[0].Shutdown(testctx.For(t), true); !errors.Is(err, core.ErrShutdown) {
			t.Fatalf("second shutdown: err = %v, want ErrShutdown", err)
		}
	})
}

// TestShutdownWaitsForCallsMadeDuringTheBarrier: w1 and w2 are in the shutdown barrier when
// w1 serves a call whose handler starts a call to w2 and replies at once; the last worker
// then enters the barrier. Nobody closes while w1's call is in flight (with a barrier of one
// round, w2 closed under it and the call failed).
func TestShutdownWaitsForCallsMadeDuringTheBarrier(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		var w1 atomic.Pointer[core.Agent]
		var spawned atomic.Pointer[core.CallFuture]
		opts.Handlers = map[string]core.Handler{
			"spawn": core.HandlerFunc(func(_ context.Context, _ core.Message) (core.Message, error) {
				spawned.Store(w1.Load().CallAsync(testctx.For(t), "w2", "slow", core.Message{}))
				return core.Message{}, nil
			}),
			"slow": core.HandlerFunc(func(_ context.Context, _ core.Message) (core.Message, error) {
				time.Sleep(300 * time.Millisecond)
				return core.Message{Payload: []byte("done")}, nil
			}),
		}
		c := coretest.New(t, 3, opts)
		w1.Store(c.Agents[1])
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		errs := make(chan error, 2)
		for _, a := range c.Agents[1:] {
			go func() { errs <- a.Shutdown(ctx, true) }()
		}
		// w1 and w2 wait in the barrier.
		waitFor(t, func() bool { return c.Agents[1].ShuttingDown() && c.Agents[2].ShuttingDown() })
		if _, err := c.Agents[0].Call(ctx, "w1", "spawn", core.Message{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Agents[0].Shutdown(ctx, true); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		reply, err := spawned.Load().Result()
		if err != nil || string(reply.Payload) != "done" {
			t.Fatalf("the call w1 made during the barrier: %q, %v; want it completed", reply.Payload, err)
		}
	})
}

// TestSelfCallsGetTheirOwnCopies: a call a worker makes to itself hands its handler and its
// caller their own memory, as a remote call does: the handler changing its request, or reusing
// its reply's buffer once it has replied, changes nothing the caller holds.
func TestSelfCallsGetTheirOwnCopies(t *testing.T) {
	tests := []struct {
		name string
		size int
	}{
		{name: "small", size: 100},
		{name: "big", size: 4 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scratch := make([]byte, tt.size)
			handlers := map[string]core.Handler{
				"scribble": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
					for i := range req.Buffers[0] {
						req.Buffers[0][i] = 'h'
					}
					for i := range scratch {
						scratch[i] = 'r'
					}
					return core.Message{Payload: []byte("p"), Buffers: [][]byte{scratch}}, nil
				}),
			}
			a := coretest.New(t, 1, coretest.Options{Handlers: handlers}).Agents[0]
			arg := bytes.Repeat([]byte{'c'}, tt.size)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			reply, err := a.Call(ctx, "w0", "scribble", core.Message{Payload: []byte("p"), Buffers: [][]byte{arg}})
			if err != nil {
				t.Fatal(err)
			}
			for i := range scratch {
				scratch[i] = 'x' // the handler's buffer, reused after it replied
			}
			if !bytes.Equal(arg, bytes.Repeat([]byte{'c'}, tt.size)) {
				t.Error("the handler wrote into the caller's request")
			}
			if len(reply.Buffers) != 1 || !bytes.Equal(reply.Buffers[0], bytes.Repeat([]byte{'r'}, tt.size)) {
				t.Error("the caller's reply changed when the handler reused its buffer")
			}
		})
	}
}

// TestAGracefulShutdownThatTimesOutSaysSoAndCloses: a worker whose graceful shutdown waits in
// vain for another (which has not called Shutdown) gets ErrShutdownTimedOut at its deadline,
// and is closed all the same.
func TestAGracefulShutdownThatTimesOutSaysSoAndCloses(t *testing.T) {
	for _, tr := range []string{core.TransportGRPC, core.TransportSHM} {
		t.Run(tr, func(t *testing.T) {
			c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{tr}, Handlers: testHandlers(nil)})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := c.Agents[0].Shutdown(ctx, true)
			if !errors.Is(err, core.ErrShutdownTimedOut) || !strings.Contains(err.Error(), "[1]") {
				t.Fatalf("err = %v, want ErrShutdownTimedOut naming rank 1", err)
			}
			if _, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{}); !errors.Is(err, core.ErrShutdown) {
				t.Fatalf("a call after the timed-out shutdown: err = %v, want ErrShutdown", err)
			}
			c.Agents[1].Shutdown(context.Background(), false)
		})
	}
}

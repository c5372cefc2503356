package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func TestBigMessagesTravelInChunks(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		opts.ChunkSize = 4 << 10
		c := coretest.New(t, 2, opts)
		tests := []struct {
			name string
			req  core.Message
		}{
			{name: "payload only", req: core.Message{Payload: pattern(100_000, 1)}},
			{name: "payload and buffers", req: core.Message{Payload: pattern(10, 2), Buffers: [][]byte{pattern(50_000, 3), {}, pattern(4096, 4), pattern(1, 5)}}},
			{name: "just over one chunk", req: core.Message{Payload: pattern(4<<10, 6)}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", tt.req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Release()
				if !resp.Pooled() {
					t.Error("a chunked reply should arrive in one pooled buffer")
				}
				if !bytes.Equal(resp.Payload, tt.req.Payload) || len(resp.Buffers) != len(tt.req.Buffers) {
					t.Fatalf("payload or buffer count differs")
				}
				for i := range resp.Buffers {
					if !bytes.Equal(resp.Buffers[i], tt.req.Buffers[i]) {
						t.Fatalf("buffer %d differs", i)
					}
				}
			})
		}
	})
}

// TestSmallCallsOvertakeABigTransfer: small calls are answered while a big message's chunks
// cannot move (held on the network), so they wait for no part of it.
func TestSmallCallsOvertakeABigTransfer(t *testing.T) {
	handlers := testHandlers(nil)
	handlers["sink"] = core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) { return core.Message{}, nil })
	network := transport.NewInmemNetwork()
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers, ChunkSize: 64 << 10, Network: network})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	held := network.Inject(transport.Fault{Match: func(f *wire.Frame) bool { return f.Kind == wire.FrameChunk }, Hold: release})
	big := c.Agents[0].CallAsync(ctx, "w1", "sink", core.Message{Payload: make([]byte, 64<<20)})
	for held.Hits() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("no chunk of the big message was sent within 30 s")
		case <-time.After(time.Millisecond):
		}
	}
	for i := 0; i < 20; i++ {
		if _, err := c.Agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("small")}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-big.Done():
		t.Fatal("the big call finished while its chunks were held")
	default:
	}
	close(release)
	if _, err := big.Result(); err != nil {
		t.Fatal(err)
	}
}

func TestSizeLimits(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.ChunkSize = 4 << 10
		opts.MaxMessageSize = 64 << 10
		opts.Handlers = testHandlers(nil)
		opts.Handlers["grow"] = core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
			return core.Message{Payload: make([]byte, 100<<10)}, nil
		})
		c := coretest.New(t, 2, opts)
		_, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{Payload: make([]byte, 65<<10)})
		if !errors.Is(err, core.ErrTooLarge) || !strings.Contains(err.Error(), "nothing was sent") {
			t.Fatalf("err = %v, want ErrTooLarge before sending", err)
		}
		_, err = c.Agents[0].Call(testctx.For(t), "w1", "grow", core.Message{})
		if !errors.Is(err, core.ErrTooLarge) || !strings.Contains(err.Error(), "reply") {
			t.Fatalf("err = %v, want ErrTooLarge for the reply", err)
		}
		if resp, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{Payload: make([]byte, 60<<10)}); err != nil || len(resp.Payload) != 60<<10 {
			t.Fatalf("the callee stopped serving: %v", err)
		}
	})
}

// TestAbortedTransferFreesTheCallee: a big request abandoned by its caller while it is being
// sent frees the memory its callee reserved for it, and the callee goes on serving.
func TestAbortedTransferFreesTheCallee(t *testing.T) {
	const size = 128 << 20
	// calleeFreed waits until the callee holds no receive memory any more.
	calleeFreed := func(t *testing.T, callee *core.Agent, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			inUse, _ := callee.ReceiveMemory()
			if inUse == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the callee still holds %d bytes of receive memory for the aborted request after 10 s", what, inUse)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// In memory, the request's chunks are held on their way, so it is abandoned exactly
	// while the callee holds memory for it and has only its header.
	t.Run("inmem", func(t *testing.T) {
		network := transport.NewInmemNetwork()
		c := coretest.New(t, 2, coretest.Options{Handlers: testHandlers(nil), ChunkSize: 64 << 10, Network: network})
		caller, callee := c.Agents[0], c.Agents[1]
		release := make(chan struct{})
		held := network.Inject(transport.Fault{
			From: caller.Self().Addr, To: callee.Self().Addr, Hold: release,
			Match: func(f *wire.Frame) bool { return f.Kind == wire.FrameChunk },
		})
		defer held.Remove()
		ctx, cancel := context.WithCancel(testctx.For(t))
		f := caller.CallAsync(ctx, "w1", "echo", core.Message{Payload: make([]byte, size)})
		// The callee reserved the request's memory when its header came.
		deadline := time.Now().Add(10 * time.Second)
		for inUse, _ := callee.ReceiveMemory(); inUse < size; inUse, _ = callee.ReceiveMemory() {
			if time.Now().After(deadline) {
				t.Fatalf("the callee reserved %d bytes within 10 s, want the request's %d", inUse, size)
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-f.Done()
		if _, err := f.Result(); !errors.Is(err, core.ErrCanceled) {
			t.Fatalf("the abandoned call: err = %v, want canceled", err)
		}
		close(release) // the chunks sent so far go on, and the abort after them
		select {
		case <-f.Sent():
		case <-time.After(10 * time.Second):
			t.Fatal("the caller still holds the aborted request's memory")
		}
		if held.Hits() == 0 || held.Hits()*(64<<10) >= size {
			t.Fatalf("%d chunks of the request were sent, want some but not all: it was not abandoned midway", held.Hits())
		}
		calleeFreed(t, callee, "inmem")
		resp, err := caller.Call(testctx.For(t), "w1", "echo", core.Message{Payload: []byte("after")})
		if err != nil || string(resp.Payload) != "after" {
			t.Fatalf("got %q, %v", resp.Payload, err)
		}
	})
	// Over gRPC, with a deadline that ends the call while it is being sent.
	t.Run("grpc", func(t *testing.T) {
		c := coretest.New(t, 2, coretest.Options{GRPC: true, Handlers: testHandlers(nil), ChunkSize: 64 << 10})
		for i := 0; i < 3; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			f := c.Agents[0].CallAsync(ctx, "w1", "echo", core.Message{Payload: make([]byte, size)})
			<-f.Done()
			select {
			case <-f.Sent():
			case <-time.After(10 * time.Second):
				t.Fatal("the caller still holds the aborted request's memory")
			}
			cancel()
			calleeFreed(t, c.Agents[1], fmt.Sprintf("grpc, call %d", i))
		}
		resp, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{Payload: []byte("after")})
		if err != nil || string(resp.Payload) != "after" {
			t.Fatalf("got %q, %v", resp.Payload, err)
		}
	})
}

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

func TestAbortedTransferFreesTheCallee(t *testing.T) {
	opts := coretest.Options{GRPC: true, Handlers: testHandlers(nil), ChunkSize: 64 << 10}
	c := coretest.New(t, 2, opts)
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		f := c.Agents[0].CallAsync(ctx, "w1", "echo", core.Message{Payload: make([]byte, 128<<20)})
		<-f.Done()
		select {
		case <-f.Sent():
		case <-time.After(10 * time.Second):
			t.Fatal("the aborted request's memory is still in use")
		}
		cancel()
	}
	resp, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{Payload: []byte(fmt.Sprint("after"))})
	if err != nil || string(resp.Payload) != "after" {
		t.Fatalf("got %q, %v", resp.Payload, err)
	}
}

package core_test

import (
	"bytes"
	"context"
	"errors"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

func TestConfigRefusesNegativeLimits(t *testing.T) {
	tests := []struct {
		field string
		set   func(*core.Config)
	}{
		{"MaxMessageSize", func(c *core.Config) { c.MaxMessageSize = -1 }},
		{"ChunkSize", func(c *core.Config) { c.ChunkSize = -1 }},
		{"ReceiveBudget", func(c *core.Config) { c.ReceiveBudget = -5 }},
		{"MaxServedPerCaller", func(c *core.Config) { c.MaxServedPerCaller = -1 }},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			cfg := coretest.Configs(t, 1, coretest.Options{})[0]
			tt.set(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := core.Start(ctx, cfg)
			if err == nil {
				a.Shutdown(ctx, false)
				t.Fatalf("a negative %s was accepted", tt.field)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("err = %v, want it to name %s", err, tt.field)
			}
		})
	}
}

// panicky is a raw handler whose ServeRPC panics on the stream's own goroutine.
type panicky struct{}

func (panicky) ServeRPC(*core.ServerCall) { panic("raw handler bug") }

// TestPanickingHandlersFailOnlyTheirCall: a handler's panic becomes its call's error; the
// worker, and the stream the call came on, keep serving.
func TestPanickingHandlersFailOnlyTheirCall(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		opts.Handlers["raw-panic"] = panicky{}
		opts.Handlers["func-panic"] = core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
			var m map[string]int
			m["boom"]++ // a nil map: a real bug's panic
			return core.Message{}, nil
		})
		c := coretest.New(t, 2, opts)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, method := range []string{"raw-panic", "func-panic", "raw-panic"} {
			_, err := c.Agents[0].Call(ctx, "w1", method, core.Message{})
			var re *core.RemoteError
			if !errors.As(err, &re) || !strings.Contains(re.Message, "panic") || !strings.Contains(re.Message, method) {
				t.Fatalf("%s: err = %v, want a remote error naming the panic and the method", method, err)
			}
			resp, err := c.Agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("alive")})
			if err != nil || string(resp.Payload) != "alive" {
				t.Fatalf("after %s the worker stopped serving: %q, %v", method, resp.Payload, err)
			}
		}
	})
}

func TestReleaseForkRefusesUnknownOwners(t *testing.T) {
	c := coretest.New(t, 2, coretest.Options{})
	a := c.Agents[0]
	for _, owner := range []int{-1, 2, 1 << 40} {
		if err := a.ReleaseFork(owner, a.NewRRefID(), a.NewRRefID()); !errors.Is(err, core.ErrUnknownWorker) {
			t.Fatalf("owner %d: err = %v, want ErrUnknownWorker", owner, err)
		}
	}
	// Nothing was queued that the goroutine sending releases could trip over: a valid release
	// and a call after it go through (a panic there would end this test binary).
	if err := a.ReleaseFork(1, a.NewRRefID(), a.NewRRefID()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Call(ctx, "w1", "missing", core.Message{}); !errors.Is(err, core.ErrNoHandler) {
		t.Fatalf("err = %v, want ErrNoHandler from a live peer", err)
	}
}

// TestHugeErrorsFailOnlyTheirCall: an error text of 20 MiB (over a frame) is cut to its head
// and tail; the stream it travels on, and a big transfer under way on it, are unharmed.
func TestHugeErrorsFailOnlyTheirCall(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		huge := "first line\n" + strings.Repeat("x", 20<<20) + "\nlast line"
		opts.Handlers["huge-error"] = core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
			return core.Message{}, errors.New(huge)
		})
		c := coretest.New(t, 2, opts)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		big := pattern(8<<20, 3)
		transfer := c.Agents[0].CallAsync(ctx, "w1", "echo", core.Message{Payload: big})
		_, err := c.Agents[0].Call(ctx, "w1", "huge-error", core.Message{})
		var re *core.RemoteError
		if !errors.As(err, &re) || len(re.Message) > 64<<10 || !strings.HasPrefix(re.Message, "first line") || !strings.HasSuffix(re.Message, "last line") {
			t.Fatalf("got %d bytes of error (%v), want at most 64 KiB keeping head and tail", len(re.Message), errors.Is(err, core.ErrPeerLost))
		}
		resp, err := transfer.Result()
		if err != nil || !bytes.Equal(resp.Payload, big) {
			t.Fatalf("the transfer under way failed: %v", err)
		}
		if _, err := c.Agents[0].Call(ctx, "w1", strings.Repeat("m", 2000), core.Message{}); err == nil || !strings.Contains(err.Error(), "method name") {
			t.Fatalf("a 2000-byte method name: err = %v, want it refused on the caller", err)
		}
	})
}

// TestMessagesOverTheReceiversLimitsFailOnlyTheirCall: a request or reply bigger than what
// the receiving worker takes (its size limit, its whole receive budget) fails that call with
// ErrTooLarge; the stream goes on serving.
func TestMessagesOverTheReceiversLimitsFailOnlyTheirCall(t *testing.T) {
	forEachTransport(t, func(t *testing.T, opts coretest.Options) {
		opts.Handlers = testHandlers(nil)
		opts.ChunkSize = 64 << 10
		cfgs := coretest.Configs(t, 3, opts)
		cfgs[0].MaxMessageSize = 1 << 20 // w0 takes less than w1 sends back
		cfgs[2].ReceiveBudget = 1 << 20  // w2 receives at most 1 MiB at once
		c := coretest.Start(t, cfgs)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		tests := []struct {
			name, from, to, method string
			req                    core.Message
			want                   string
		}{
			{name: "a reply over the caller's limit", from: "w0", to: "w1", method: "grow", want: "over this worker's 1048576-byte limit"},
			{name: "a request over the callee's budget", from: "w1", to: "w2", method: "echo", req: core.Message{Payload: make([]byte, 2<<20)}, want: "receive budget"},
		}
		for _, a := range c.Agents {
			a.Register("grow", core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
				return core.Message{Payload: make([]byte, 3<<20)}, nil
			}))
		}
		for _, tt := range tests {
			_, err := c.Agents[map[string]int{"w0": 0, "w1": 1}[tt.from]].Call(ctx, tt.to, tt.method, tt.req)
			if !errors.Is(err, core.ErrTooLarge) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.to) {
				t.Fatalf("%s: err = %v, want ErrTooLarge saying %q", tt.name, err, tt.want)
			}
			resp, err := c.Agents[map[string]int{"w0": 0, "w1": 1}[tt.from]].Call(ctx, tt.to, "echo", core.Message{Payload: []byte("next")})
			if err != nil || string(resp.Payload) != "next" {
				t.Fatalf("after %s the stream stopped serving: %v", tt.name, err)
			}
		}
	})
}

// TestBigMessagesWaitForTheReceiveBudget: with a budget for about one message at a time,
// many big calls at once all complete, and the memory being received never passes the budget
// by more than the one interleave window a stream may take.
func TestBigMessagesWaitForTheReceiveBudget(t *testing.T) {
	opts := coretest.Options{GRPC: true, Handlers: testHandlers(nil), ChunkSize: 64 << 10}
	cfgs := coretest.Configs(t, 4, opts)
	// 12 calls of 8 MiB, 4 from each of three workers: without the budget, the three streams
	// would take up to a window each.
	const budget, size = 10 << 20, 8 << 20
	cfgs[3].ReceiveBudget = budget
	c := coretest.Start(t, cfgs)
	// This test is about memory: a sender starved of CPU for a while (2 cores, -race binaries
	// side by side) must make it wait, not have its stream evicted as stalled.
	c.Agents[3].SetReceiveIdleLimit(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Streams are dialed before the storm: this test is about memory, and a dial that a
	// loaded 2-core machine makes slow is not.
	for i := 0; i < 3; i++ {
		if _, err := c.Agents[i].Call(ctx, "w3", "echo", core.Message{}); err != nil {
			t.Fatal(err)
		}
	}
	peakInUse := coretest.Peak(100*time.Microsecond, func() int64 {
		inUse, _ := c.Agents[3].ReceiveMemory()
		return inUse
	})
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := 0; i < 3; i++ {
		for j := 0; j < 4; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A block repeated: byte by byte, 240 MiB of patterns cost most of the test
				// under -race.
				want := bytes.Repeat(pattern(4096, byte(i*10+j)), size/4096)
				resp, err := c.Agents[i].Call(ctx, "w3", "echo", core.Message{Payload: want})
				if err == nil && !bytes.Equal(resp.Payload, want) {
					err = errors.New("the echo differs")
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	peak := peakInUse()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if peak > budget+64<<20 {
		t.Fatalf("%d bytes were being received at once, over the %d-byte budget and its window", peak, budget)
	}
	if inUse, _ := c.Agents[3].ReceiveMemory(); inUse != 0 {
		t.Fatalf("%d bytes still reserved with nothing being received", inUse)
	}
}

func TestReceiveBudgetFromTheEnvironment(t *testing.T) {
	tests := []struct {
		value   string
		want    int64
		wantErr string
	}{
		{value: "", want: 0},
		{value: "1048576", want: 1 << 20},
		{value: "-5", wantErr: "positive number of bytes"},
		{value: "2GiB", wantErr: `TENSORPLAY_RPC_RECEIVE_BUDGET="2GiB"`},
	}
	for _, tt := range tests {
		t.Setenv("TENSORPLAY_RPC_RECEIVE_BUDGET", tt.value)
		cfg := coretest.Configs(t, 1, coretest.Options{})[0]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a, err := core.Start(ctx, cfg)
		cancel()
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: err = %v, want it to say %q", tt.value, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tt.value, err)
		}
		if _, budget := a.ReceiveMemory(); tt.want != 0 && budget != tt.want {
			t.Errorf("%q: budget %d, want %d", tt.value, budget, tt.want)
		}
		a.Shutdown(testctx.For(t), false)
	}
}

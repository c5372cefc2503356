package core_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// A world of two agents in one program: each registers an "upper" handler, and w0 calls w1.
// Real programs run one agent per process with the same InitMethod.
func Example() {
	// A file store needs no free port; between hosts use "tcp://host:port" (rank 0 serves it).
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	store := "file://" + filepath.Join(dir, "store")

	upper := core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
		return core.Message{Payload: []byte(strings.ToUpper(string(req.Payload)))}, nil
	})
	agents := make([]*core.Agent, 2)
	var wg sync.WaitGroup
	for rank := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := core.Start(context.Background(), core.Config{
				Name: fmt.Sprintf("w%d", rank), Rank: rank, WorldSize: 2, InitMethod: store,
				Handlers: map[string]core.Handler{"upper": upper},
			})
			if err != nil {
				panic(err)
			}
			agents[rank] = a
		}()
	}
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := agents[0].Call(ctx, "w1", "upper", core.Message{Payload: []byte("hello")})
	fmt.Println(string(resp.Payload), err)

	// Graceful shutdown is a barrier: every agent must call it.
	for _, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); a.Shutdown(context.Background(), true) }()
	}
	wg.Wait()
	// Output: HELLO <nil>
}

// CallAsync returns at once; the future completes with the reply or an error naming the
// worker, here a timeout.
func ExampleAgent_CallAsync() {
	release := make(chan struct{})
	defer close(release)
	agents, _ := startPair(map[string]core.Handler{
		"wait": core.HandlerFunc(func(ctx context.Context, _ core.Message) (core.Message, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return core.Message{}, nil
		}),
	})
	defer func() {
		for _, a := range agents {
			a.Shutdown(context.Background(), false)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	f := agents[0].CallAsync(ctx, "w1", "wait", core.Message{})
	_, err := f.Result()
	fmt.Println(err)
	// Output: RPC timed out: the call to worker "w1" ran past its deadline
}

// startPair starts a two-worker world on an in-memory network.
func startPair(handlers map[string]core.Handler) ([]*core.Agent, error) {
	store, network := rendezvous.NewMemStore(2), transport.NewInmemNetwork()
	return startAll(2, func(cfg *core.Config) {
		cfg.Store, cfg.Transport, cfg.Handlers = store, network.Transport(), handlers
	})
}

// startAll starts a world of n agents at once (each one's join waits for the others), named
// w0…w(n-1), their configs finished by set.
func startAll(n int, set func(*core.Config)) ([]*core.Agent, error) {
	agents := make([]*core.Agent, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := core.Config{Name: fmt.Sprintf("w%d", rank), Rank: rank, WorldSize: n}
			set(&cfg)
			agents[rank], errs[rank] = core.Start(context.Background(), cfg)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return agents, nil
}

// Workers on one host talk over shared memory unless told otherwise; Config.Transports (or
// TENSORPLAY_RPC_TRANSPORTS) pins them, here to gRPC, the path between hosts.
func ExampleConfig_transports() {
	// A file store needs no free port; between hosts use "tcp://host:port" (rank 0 serves it).
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	store := "file://" + filepath.Join(dir, "store")

	echo := core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
		return req, nil
	})
	agents, err := startAll(2, func(cfg *core.Config) {
		cfg.InitMethod = store
		cfg.Handlers = map[string]core.Handler{"echo": echo}
		cfg.Transports = []string{core.TransportGRPC}
	})
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, a := range agents {
			a.Shutdown(context.Background(), false)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("over gRPC")})
	fmt.Println(string(resp.Payload), err)
	fmt.Println(strings.HasPrefix(agents[1].Self().Addr, "grpc="), strings.Contains(agents[1].Self().Addr, "shm="))
	// Output:
	// over gRPC <nil>
	// true false
}

// A thread that waits for its call (a C or Python thread calling into Go, locked to its
// goroutine) may read the reply itself: over shared memory the reply then wakes it directly,
// not through the stream's reader goroutine. Where it cannot read, AwaitReading returns at once
// with the whole wait left, and the thread waits as usual.
func ExampleCallFuture_AwaitReading() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	echo := core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
		return req, nil
	})
	agents, err := startAll(2, func(cfg *core.Config) {
		cfg.InitMethod = "file://" + filepath.Join(dir, "store")
		cfg.Handlers = map[string]core.Handler{"echo": echo}
		cfg.Transports = []string{core.TransportSHM}
	})
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, a := range agents {
			a.Shutdown(context.Background(), false)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f := agents[0].CallAsync(ctx, "w1", "echo", core.Message{Payload: []byte("read by the thread that waited")})
	f.AwaitReading(time.Second)
	resp, err := f.Result() // at once if the reply came meanwhile
	fmt.Println(string(resp.Payload), err)
	// Output: read by the thread that waited <nil>
}

// A pool of threads that run requests (C or Python threads calling into Go, each locked to its
// goroutine) may wait for work by reading the stream of the caller served last: over shared
// memory a request then wakes such a thread directly, which serves it as the stream's reader
// goroutine would, handler included. A handler that queues the request for the pool hands it
// to the thread that read it. Where it cannot read, ServeReading returns at once with the whole
// wait left, and the thread waits as usual.
func ExampleAgent_ServeReading() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	// It replies on the goroutine that reads the request: it does not block.
	echo := inlineHandler(func(call *core.ServerCall) {
		call.Reply(core.Message{Payload: bytes.Clone(call.Request.Payload)})
		call.Request.Release()
	})
	agents, err := startAll(2, func(cfg *core.Config) {
		cfg.InitMethod = "file://" + filepath.Join(dir, "store")
		cfg.Handlers = map[string]core.Handler{"echo": echo}
		cfg.Transports = []string{core.TransportSHM}
	})
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, a := range agents {
			a.Shutdown(context.Background(), false)
		}
	}()
	var stopped atomic.Bool
	var wake atomic.Pointer[func()] // what wakes the thread while it reads
	done := make(chan struct{})
	go func() { // a pool thread of the callee
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for !stopped.Load() {
			if left := agents[1].ServeReading(100*time.Millisecond, stopped.Load, &wake); left > 0 {
				time.Sleep(time.Millisecond) // it could not read: wait otherwise
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, text := range []string{"first", "second"} {
		resp, err := agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte(text)})
		fmt.Println(string(resp.Payload), err)
	}
	stopped.Store(true)
	if w := wake.Load(); w != nil {
		(*w)()
	}
	<-done
	// Output:
	// first <nil>
	// second <nil>
}

// inlineHandler is a Handler that runs on the goroutine (or thread) that read the request, as
// one a thread reading for itself runs must (ServeReading): it does not block.
type inlineHandler func(call *core.ServerCall)

func (h inlineHandler) ServeRPC(call *core.ServerCall) { h(call) }

// A dynamic world (WorldSize 0, torch's world_size=None): workers join one at a time and leave
// with Shutdown, and every agent's Workers follows. Real programs run one agent per process
// with InitMethod "tcp://host:port"; rank 0 serves the membership there.
func ExampleStart_dynamic() {
	store, network := rendezvous.NewMemStore(0), transport.NewInmemNetwork()
	join := func(name string, rank int) *core.Agent {
		a, err := core.Start(context.Background(), core.Config{
			Name: name, Rank: rank, Store: store, Transport: network.Transport(),
		})
		if err != nil {
			panic(err)
		}
		return a
	}
	trainer := join("trainer", 0)
	defer trainer.Shutdown(context.Background(), true)
	fmt.Println(trainer.Workers())

	actor := join("actor-7", 7)
	fmt.Println(trainer.Workers())

	actor.Shutdown(context.Background(), true) // leaves: no barrier with the others
	_, err := trainer.CallRank(context.Background(), 7, "act", core.Message{}).Result()
	fmt.Println(trainer.Workers(), err)
	// Output:
	// [WorkerInfo(id=0, name=trainer)]
	// [WorkerInfo(id=0, name=trainer) WorkerInfo(id=7, name=actor-7)]
	// [WorkerInfo(id=0, name=trainer)] worker "actor-7" (id 7) left the world
}

// Plain Go functions serve calls from any language (Python calls them with
// rpc.remote_function("add")); CallFunc calls them, or the functions a Python worker exposes
// with rpc.expose, with msgpack arguments and a typed result.
func ExampleFunc() {
	add := func(_ context.Context, a, b float64) (float64, error) { return a + b, nil }
	agents, stop := twoAgents(map[string]core.Handler{"add": core.Func(add)}) // as in Example
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sum, err := core.CallFunc[float64](ctx, agents[0], "w1", "add", 2, 3.5)
	fmt.Println(sum, err)
	_, err = core.CallFunc[float64](ctx, agents[0], "w1", "add", 2)
	fmt.Println(err)
	// Output:
	// 5.5 <nil>
	// on worker "w1": takes 2 argument(s), got 1
}

// Arrays cross languages in place: ArrayOf wraps a slice without a copy, Elements reads one
// back as a typed slice over the received memory. Python sends numpy arrays and torch tensors
// as Arrays, and receives Arrays as numpy arrays.
func ExampleElements() {
	// Column sums of a 2-D float32 array.
	colSums := func(_ context.Context, a core.Array) ([]float32, error) {
		xs, err := core.Elements[float32](a)
		if err != nil || len(a.Shape) != 2 {
			return nil, fmt.Errorf("want a 2-D float32 array, got %s %v (%v)", a.DType, a.Shape, err)
		}
		sums := make([]float32, a.Shape[1])
		for i, x := range xs {
			sums[i%a.Shape[1]] += x
		}
		return sums, nil
	}
	agents, stop := twoAgents(map[string]core.Handler{"col_sums": core.Func(colSums)}) // as in Example
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := core.ArrayOf([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	sums, err := core.CallFunc[[]float32](ctx, agents[0], "w1", "col_sums", m)
	fmt.Println(sums, err)
	// Output: [5 7 9] <nil>
}

// twoAgents starts workers w0 and w1 in this program, as Example does, with handlers; stop
// shuts them down.
func twoAgents(handlers map[string]core.Handler) (agents []*core.Agent, stop func()) {
	dir, _ := os.MkdirTemp("", "example")
	store := "file://" + filepath.Join(dir, "store")
	agents = make([]*core.Agent, 2)
	var wg sync.WaitGroup
	for rank := range agents {
		wg.Go(func() {
			a, err := core.Start(context.Background(), core.Config{
				Name: fmt.Sprintf("w%d", rank), Rank: rank, WorldSize: 2, InitMethod: store, Handlers: handlers,
			})
			if err != nil {
				panic(err)
			}
			agents[rank] = a
		})
	}
	wg.Wait()
	return agents, func() {
		for _, a := range agents {
			wg.Go(func() { a.Shutdown(context.Background(), true) })
		}
		wg.Wait()
		os.RemoveAll(dir)
	}
}

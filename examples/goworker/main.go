// Command goworker is a Go program that joins a world of Python workers as a worker of its
// own: Python calls its Go functions by name (rpc.remote_function), and it calls a function a
// Python worker exposes (rpc.expose). It reads MASTER_ADDR and MASTER_PORT as Python workers do.
//
//	MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 go run ./examples/goworker -name feature-store -rank 2 -world-size 3 -python trainer
//
// With -python it calls train_step and boom on that worker and prints each outcome as a line
// of JSON; then it leaves with the world (a graceful shutdown: it serves until every worker
// has called shutdown).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// lookup is a stand-in feature store: the features of each id.
func lookup(_ context.Context, ids []int64) (map[string][]float64, error) {
	out := make(map[string][]float64, len(ids))
	for _, id := range ids {
		if id < 0 {
			return nil, fmt.Errorf("no features for id %d", id)
		}
		out[fmt.Sprint(id)] = []float64{float64(id), float64(id) * 0.5}
	}
	return out, nil
}

func add(_ context.Context, a, b float64) (float64, error) { return a + b, nil }

// stats describes an array (numpy's or torch's, sent from Python): dtype, shape, and the sum
// of its elements.
func stats(_ context.Context, a core.Array) (map[string]any, error) {
	var sum float64
	var err error
	switch a.DType {
	case "float32":
		sum, err = sumOf[float32](a)
	case "float64":
		sum, err = sumOf[float64](a)
	case "int8":
		sum, err = sumOf[int8](a)
	case "int16":
		sum, err = sumOf[int16](a)
	case "int32":
		sum, err = sumOf[int32](a)
	case "int64":
		sum, err = sumOf[int64](a)
	case "uint8":
		sum, err = sumOf[uint8](a)
	case "uint16":
		sum, err = sumOf[uint16](a)
	case "uint32":
		sum, err = sumOf[uint32](a)
	case "uint64":
		sum, err = sumOf[uint64](a)
	case "bool":
		xs, e := core.Elements[bool](a)
		for _, x := range xs {
			if x {
				sum++
			}
		}
		err = e
	}
	return map[string]any{"dtype": a.DType, "shape": a.Shape, "sum": sum}, err
}

func sumOf[T float32 | float64 | int8 | int16 | int32 | int64 | uint8 | uint16 | uint32 | uint64](a core.Array) (float64, error) {
	xs, err := core.Elements[T](a)
	var sum float64
	for _, x := range xs {
		sum += float64(x)
	}
	return sum, err
}

// scale multiplies a float32 array by k in place (it is this call's own copy) and sends it back.
func scale(_ context.Context, a core.Array, k float32) (core.Array, error) {
	xs, err := core.Elements[float32](a)
	if err != nil {
		return core.Array{}, err
	}
	for i := range xs {
		xs[i] *= k
	}
	return a, nil
}

// sleep waits, or gives up when the caller does.
func sleep(ctx context.Context, seconds float64) (string, error) {
	log.Printf("sleeping %g s for a caller", seconds)
	select {
	case <-time.After(time.Duration(seconds * float64(time.Second))):
		return "slept", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func main() {
	name := flag.String("name", "feature-store", "this worker's name")
	rank := flag.Int("rank", envInt("RANK", 0), "this worker's rank (default $RANK)")
	worldSize := flag.Int("world-size", envInt("WORLD_SIZE", 1), "the number of workers in the world (default $WORLD_SIZE)")
	python := flag.String("python", "", "a Python worker to call train_step and boom on")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, err := core.Start(ctx, core.Config{
		Name: *name, Rank: *rank, WorldSize: *worldSize, // the token: $TENSORPLAY_RPC_TOKEN
		Handlers: map[string]core.Handler{
			"lookup": core.Func(lookup),
			"add":    core.Func(add),
			"sleep":  core.Func(sleep),
			"stats":  core.Func(stats),
			"scale":  core.Func(scale),
		},
	})
	if err != nil {
		log.Fatalf("join the world: %v", err)
	}
	// How many results of remote() calls to it this worker keeps (each until its last RRef
	// is gone): for tests, and to watch for leaks.
	agent.Register("owned", core.Func(func(context.Context) (int, error) { return agent.OwnedValues(), nil }))
	if *python != "" {
		callPython(ctx, agent, *python)
	}
	if err := agent.Shutdown(ctx, true); err != nil {
		log.Fatalf("shutdown: %v", err)
	}
}

// callPython calls two functions a Python worker exposes and prints what each did.
func callPython(ctx context.Context, agent *core.Agent, worker string) {
	out := json.NewEncoder(os.Stdout)
	step, err := core.CallFunc[map[string]float64](ctx, agent, worker, "train_step", []float32{1, 2, 3.5}, 0.1)
	out.Encode(map[string]any{"call": "train_step", "result": step, "error": errText(err)})

	weights, err := core.CallFunc[core.Array](ctx, agent, worker, "normalize", core.ArrayOf([]float64{1, 3, 4}))
	normalized, _ := core.Elements[float64](weights)
	out.Encode(map[string]any{"call": "normalize", "result": normalized, "dtype": weights.DType, "shape": weights.Shape, "error": errText(err)})

	// Any importable function, if the worker allows it (rpc.expose_imports()); refused if not.
	hypot, err := core.CallFunc[float64](ctx, agent, worker, "math:hypot", 3, 4)
	out.Encode(map[string]any{"call": "math:hypot", "result": hypot, "error": errText(err)})

	// A Python function that takes longer than the caller waits: the call fails at the deadline.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	started := time.Now()
	_, err = core.CallFunc[any](short, agent, worker, "slow", 5)
	cancel()
	out.Encode(map[string]any{"call": "slow", "error": errText(err), "timeout": errors.Is(err, core.ErrTimeout), "seconds": time.Since(started).Seconds()})

	_, err = core.CallFunc[any](ctx, agent, worker, "boom", "on purpose")
	var pyErr *core.PythonError
	if errors.As(err, &pyErr) {
		out.Encode(map[string]any{"call": "boom", "type": pyErr.Type, "message": pyErr.Message, "traceback": pyErr.Traceback, "worker": pyErr.Worker})
	} else {
		out.Encode(map[string]any{"call": "boom", "error": errText(err)})
	}
}

// envInt is the integer in environment variable name, or def; as Python workers do, a launcher
// (torchrun, a job script) may set RANK and WORLD_SIZE.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

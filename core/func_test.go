package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"github.com/vmihailenco/msgpack/v5"
)

type point struct {
	X, Y float64
}

func TestFuncHandlersDecodeArgumentsAndEncodeResults(t *testing.T) {
	handlers := map[string]core.Handler{
		"add":   core.Func(func(_ context.Context, a, b int64) (int64, error) { return a + b, nil }),
		"scale": core.Func(func(_ context.Context, p point, k float64) (point, error) { return point{p.X * k, p.Y * k}, nil }),
		"fail":  core.Func(func(_ context.Context, why string) (string, error) { return "", errors.New("failed: " + why) }),
		"check": core.Func(func(_ context.Context, n int) error {
			if n < 0 {
				return fmt.Errorf("%d is negative", n)
			}
			return nil
		}),
		"wait": core.Func(func(ctx context.Context) (string, error) { <-ctx.Done(); return "", ctx.Err() }),
	}
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := c.Agents[0]

	if got, err := core.CallFunc[int64](ctx, a, "w1", "add", 2, 40); err != nil || got != 42 {
		t.Errorf("add: %v, %v; want 42", got, err)
	}
	if got, err := core.CallFunc[point](ctx, a, "w1", "scale", point{1, -2}, 3); err != nil || got != (point{3, -6}) {
		t.Errorf("scale: %v, %v; want {3 -6}", got, err)
	}
	if got, err := core.CallFunc[any](ctx, a, "w1", "check", 5); err != nil || got != nil {
		t.Errorf("check(5): %v, %v; want nil, nil", got, err)
	}

	failures := []struct {
		name, method string
		args         []any
		want         string
	}{
		{"a handler's error", "fail", []any{"on purpose"}, "failed: on purpose"},
		{"an error-only handler's error", "check", []any{-1}, "-1 is negative"},
		{"too few arguments", "add", []any{1}, "takes 2 argument(s), got 1"},
		{"too many arguments", "add", []any{1, 2, 3}, "takes 2 argument(s), got 3"},
		{"an argument of the wrong type", "add", []any{"x", 2}, "argument 1 does not decode into int64"},
		{"no such method", "nope", nil, "nope"},
	}
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			_, err := core.CallFunc[any](ctx, a, "w1", f.method, f.args...)
			if err == nil || !strings.Contains(err.Error(), f.want) || !strings.Contains(err.Error(), "w1") {
				t.Fatalf("err %v, want one naming w1 and saying %q", err, f.want)
			}
		})
	}

	t.Run("a result of the wrong type", func(t *testing.T) {
		_, err := core.CallFunc[string](ctx, a, "w1", "add", 1, 2)
		if err == nil || !strings.Contains(err.Error(), "does not decode into string") {
			t.Fatalf("err %v, want a decode error", err)
		}
	})
	t.Run("the caller's deadline reaches the function", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := core.CallFunc[string](short, a, "w1", "wait")
		if !errors.Is(err, core.ErrTimeout) {
			t.Fatalf("err %v, want ErrTimeout", err)
		}
	})
}

func TestFuncRefusesFunctionsOfTheWrongShape(t *testing.T) {
	cases := []struct {
		name string
		f    any
	}{
		{"not a function", 42},
		{"no context", func(a int) (int, error) { return a, nil }},
		{"no error", func(context.Context, int) int { return 0 }},
		{"three results", func(context.Context) (int, int, error) { return 0, 0, nil }},
		{"variadic", func(context.Context, ...int) error { return nil }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "core.Func") {
					t.Fatalf("recovered %v, want a panic naming core.Func", r)
				}
			}()
			core.Func(c.f)
		})
	}
}

// A Python exception comes back from an exposed function as a *PythonError: the failure a
// Python worker sends carries msgpack detail, which a Go handler can send too.
func TestPythonErrorsAreTyped(t *testing.T) {
	detail, _ := msgpack.Marshal(map[string]string{"type": "ValueError", "message": "bad", "traceback": "Traceback ...\nValueError: bad\n"})
	handlers := map[string]core.Handler{
		"raise": core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
			return core.Message{}, core.NewRemoteError("ValueError: bad", core.Message{Payload: detail})
		}),
	}
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := core.CallFunc[any](ctx, c.Agents[0], "w1", "raise")
	var pe *core.PythonError
	if !errors.As(err, &pe) {
		t.Fatalf("err %v (%T), want a *core.PythonError", err, err)
	}
	if pe.Worker != "w1" || pe.Type != "ValueError" || pe.Message != "bad" || !strings.Contains(pe.Traceback, "ValueError: bad") {
		t.Fatalf("got %+v", pe)
	}
	var re *core.RemoteError
	if !errors.As(err, &re) || re.Worker != "w1" {
		t.Fatalf("a PythonError must unwrap to its RemoteError, got %v", re)
	}

	// A detail nested millions deep is left as it is: decoding it would overflow the stack.
	deep := append([]byte{0x81, 0xa1, 'x'}, bytes.Repeat([]byte{0x91}, 1<<20)...)
	c.Agents[1].Register("deep", core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
		return core.Message{}, core.NewRemoteError("deep", core.Message{Payload: deep})
	}))
	_, err = core.CallFunc[any](ctx, c.Agents[0], "w1", "deep")
	if errors.As(err, &pe) || !errors.As(err, &re) || re.Message != "deep" {
		t.Fatalf("a deep detail: %v, want the RemoteError alone", err)
	}
}

func TestArraysCrossBesideTheMsgpack(t *testing.T) {
	handlers := map[string]core.Handler{
		// Scales an array of float32 in place and sends it back: its data is the request's.
		"scale": core.Func(func(_ context.Context, a core.Array, k float32) (core.Array, error) {
			xs, err := core.Elements[float32](a)
			if err != nil {
				return core.Array{}, err
			}
			for i := range xs {
				xs[i] *= k
			}
			return a, nil
		}),
		"describe": core.Func(func(_ context.Context, arrays map[string]core.Array) (map[string][]int, error) {
			out := map[string][]int{}
			for name, a := range arrays {
				out[name+":"+a.DType] = a.Shape
			}
			return out, nil
		}),
	}
	// Real transports: the in-memory one hands the callee the caller's own memory.
	c := coretest.New(t, 2, coretest.Options{GRPC: true, Handlers: handlers})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := c.Agents[0]

	data := []float32{1, 2, 3, 4, 5, 6}
	got, err := core.CallFunc[core.Array](ctx, a, "w1", "scale", core.ArrayOf(data, 2, 3), float32(10))
	if err != nil {
		t.Fatal(err)
	}
	xs, err := core.Elements[float32](got)
	if err != nil || fmt.Sprint(xs) != "[10 20 30 40 50 60]" || fmt.Sprint(got.Shape) != "[2 3]" {
		t.Fatalf("scale: %v %v %v", xs, got.Shape, err)
	}
	if data[0] != 1 {
		t.Fatal("the caller's array changed: the callee must work on the received copy")
	}
	// Big enough to arrive in one pooled buffer, its data just after a payload of any length:
	// Elements must still give the array's own memory, or the scaling is lost.
	for _, shape := range [][]int{{600000}, {2, 3, 100000}, {6, 100000}, {3, 200000}} {
		big := make([]float32, 600000)
		for i := range big {
			big[i] = float32(i % 7)
		}
		got, err := core.CallFunc[core.Array](ctx, a, "w1", "scale", core.ArrayOf(big, shape...), float32(10))
		xs, _ := core.Elements[float32](got)
		if err != nil || len(xs) != len(big) || xs[5] != 50 || xs[599999] != float32(599999%7)*10 {
			t.Fatalf("scale of shape %v: %v (%d elements)", shape, err, len(xs))
		}
	}
	if _, err := core.Elements[int64](got); err == nil || !strings.Contains(err.Error(), "holds float32, not int64") {
		t.Fatalf("Elements of the wrong type: %v", err)
	}

	shapes, err := core.CallFunc[map[string][]int](ctx, a, "w1", "describe", map[string]core.Array{
		"ids":   core.ArrayOf([]int64{1, 2, 3}),
		"mask":  core.ArrayOf([]bool{true, false}, 1, 2),
		"bytes": core.ArrayOf([]uint8{}, 0, 4),
	})
	if err != nil || fmt.Sprint(shapes) != "map[bytes:uint8:[0 4] ids:int64:[3] mask:bool:[1 2]]" {
		t.Fatalf("describe: %v, %v", shapes, err)
	}

	// Decoded into an interface, an array is an Array still.
	anyResult, err := core.CallFunc[any](ctx, a, "w1", "scale", core.ArrayOf([]float32{1}), float32(2))
	if arr, ok := anyResult.(core.Array); err != nil || !ok || arr.DType != "float32" {
		t.Fatalf("scale into any: %#v, %v", anyResult, err)
	}

	bad := []struct {
		name  string
		array core.Array
		want  string
	}{
		{"a short array", core.Array{DType: "float64", Shape: []int{3}, Data: make([]byte, 16)}, "needs 24 bytes, has 16"},
		{"an unknown dtype", core.Array{DType: "complex64", Shape: []int{1}, Data: make([]byte, 8)}, "dtype"},
		{"a negative dimension", core.Array{DType: "uint8", Shape: []int{-1}}, "shape [-1]"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			_, err := core.CallFunc[any](ctx, a, "w1", "scale", b.array, float32(1))
			if err == nil || !strings.Contains(err.Error(), b.want) {
				t.Fatalf("err %v, want one saying %q", err, b.want)
			}
		})
	}
}

func TestModuleMethodsServeEveryModuleFunctionName(t *testing.T) {
	c := coretest.New(t, 2, coretest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := c.Agents[0]
	c.Agents[1].Register(core.ModuleMethods, core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
		return core.Message{Payload: []byte{0xc3}}, nil // msgpack true
	}))
	c.Agents[1].Register("own:name", core.Func(func(context.Context) (bool, error) { return false, nil }))
	cases := []struct {
		method string
		want   bool
		err    string
	}{
		{"numpy:add", true, ""},
		{"own:name", false, ""}, // a handler of its own comes first
		{"plain", false, "is not registered"},
	}
	for _, tc := range cases {
		got, err := core.CallFunc[bool](ctx, a, "w1", tc.method)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, %v; want %v, %q", tc.method, got, err, tc.want, tc.err)
		}
	}
	c.Agents[1].Register(core.ModuleMethods, nil)
	if _, err := core.CallFunc[bool](ctx, a, "w1", "numpy:add"); !errors.Is(err, core.ErrNoHandler) {
		t.Fatalf("after the handler is removed: %v, want ErrNoHandler", err)
	}
}

// Bytes from a peer are checked before msgpack's decoder, which sizes what it makes by the
// lengths they claim, sees them: a dozen bytes claiming billions of elements are an error.
func TestFuncRefusesHostileArguments(t *testing.T) {
	h := map[string]core.Handler{"f": core.Func(func(_ context.Context, xs []int64, m map[string]string, a core.Array) (int, error) {
		return len(xs) + len(m) + len(a.Data), nil
	})}
	c := coretest.New(t, 2, coretest.Options{Handlers: h})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	arrayHead := func(head ...byte) []byte { // [[], {}, ext 1 of head]
		return append([]byte{0x93, 0x90, 0x80, 0xc7, byte(len(head)), 1}, head...)
	}
	cases := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"a slice of four billion", []byte{0x93, 0xdd, 0xff, 0xff, 0xff, 0xff}, "claims 4294967295 bytes"},
		{"a map of four billion", []byte{0x93, 0x90, 0xdf, 0xff, 0xff, 0xff, 0xff}, "claims 8589934590 bytes"},
		{"an extension of 4 GiB", []byte{0x93, 0x90, 0x80, 0xc9, 0xff, 0xff, 0xff, 0xff, 1}, "claims 4294967296 bytes"},
		{"an array's shape of four billion", arrayHead(0x93, 0xa3, 'f', 'o', 'o', 0xdd, 0xff, 0xff, 0xff, 0xff), "claims 4294967295 bytes"},
		{"an array's buffer that is not there", arrayHead(0x93, 0xa5, 'u', 'i', 'n', 't', '8', 0x91, 0x01, 0x05), "buffer 5 of a message of 0"},
		{"a bool array of other bytes", arrayHead(0x93, 0xa4, 'b', 'o', 'o', 'l', 0x91, 0x01, 0xc4, 0x01, 0x07), "holds byte 7 at 0"},
		{"nil for the arguments", []byte{0xc0}, "the arguments are nil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Agents[0].Call(ctx, "w1", "f", core.Message{Payload: tc.payload})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestABigErrorDetailIsNotLeftInSharedMemory: the detail of a failed call can be big enough to
// land in its sender's shared memory, which stays the sender's (and keeps the stream's region
// mapped) until it is released. CallFunc's error keeps a copy of its own.
func TestABigErrorDetailIsNotLeftInSharedMemory(t *testing.T) {
	detail := bytes.Repeat([]byte{0xc1}, 3<<20) // not msgpack: the error stays a *RemoteError
	handlers := map[string]core.Handler{"failbig": core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
		return core.Message{}, &core.RemoteError{Message: "failed with detail", Payload: core.Message{Payload: detail}}
	})}
	c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{core.TransportSHM}, Handlers: handlers})
	_, err := core.CallFunc[int](testctx.For(t), c.Agents[0], "w1", "failbig")
	var re *core.RemoteError
	if !errors.As(err, &re) || !bytes.Equal(re.Payload.Payload, detail) {
		t.Fatalf("got %v", err)
	}
	if where := mappingOf(t, &re.Payload.Payload[0]); strings.Contains(where, "memfd:tensorplay-rpc") {
		t.Fatalf("the error's detail lies in %s, the sender's shared memory", where)
	}
}

// mappingOf names the mapping of this process that holds p.
func mappingOf(t *testing.T, p *byte) string {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	addr := uint64(uintptr(unsafe.Pointer(p)))
	for _, line := range strings.Split(string(maps), "\n") {
		var start, end uint64
		if _, err := fmt.Sscanf(line, "%x-%x", &start, &end); err == nil && start <= addr && addr < end {
			return line
		}
	}
	return "no mapping"
}

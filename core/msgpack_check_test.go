package core

import (
	"context"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"
)

func TestCheckMsgpackTakesWhatMsgpackMakes(t *testing.T) {
	values := []any{
		nil, true, 1, -1, 300, -300, 70000, 1 << 40, -(1 << 40), 1.5, float32(2.5), "", "short",
		strings.Repeat("x", 300), strings.Repeat("y", 70000), []byte{1, 2}, make([]byte, 70000),
		[]any{}, []any{1, "a", []any{nil}}, make([]int, 20), make([]int, 70000),
		map[string]any{"a": 1, "b": []any{map[string]any{}}}, ArrayOf([]float32{1, 2, 3}),
	}
	for _, v := range values {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkMsgpack(b); err != nil {
			t.Errorf("%T %.40v: %v", v, v, err)
		}
	}
	for _, ext := range [][]byte{{0xd4, 1, 0}, {0xd8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0xc7, 2, 1, 0, 0}, {0xc8, 0, 1, 1, 0}, {0xc9, 0, 0, 0, 1, 1, 0}} {
		if err := checkMsgpack(ext); err != nil {
			t.Errorf("%x: %v", ext, err)
		}
	}
}

func TestCheckMsgpackRefusesLengthsThatAreNotThere(t *testing.T) {
	cases := []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"an array of four billion", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, "claims 4294967295 bytes"},
		{"a map of four billion", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, "claims 8589934590 bytes"},
		{"a 4 GiB string", []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, "claims 4294967295 bytes"},
		{"a 4 GiB extension", []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 1}, "claims 4294967296 bytes"},
		{"a cut number", []byte{0xcf, 1, 2}, "claims 8 bytes"},
		{"nothing", nil, "claims 1 bytes"},
		{"a byte that starts nothing", []byte{0xc1}, "starts no msgpack value"},
		{"two values", []byte{0x01, 0x02}, "1 bytes follow"},
		{"too deep", append(repeat(0x91, maxMsgpackDepth+1), 0xc0), "nested more than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := checkMsgpack(c.bytes); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one saying %q", err, c.want)
			}
		})
	}
}

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// TestArgumentsAreDecodedFromAPrivateCopy: a big request received over shared memory lies in
// memory its sender can still write. Bytes that passed the check and then change must not
// reach the decoder: here one flip turns a 1-element list into a claim of 16M elements, which
// msgpack would allocate at once. The sender writes through a mapping of its own, as another
// process would.
func TestArgumentsAreDecodedFromAPrivateCopy(t *testing.T) {
	typ := reflect.TypeOf(func(ctx context.Context, xs []int64) error { return nil })
	fd, err := unix.MemfdCreate("test", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	mine, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mine)
	senders, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(senders)
	payload := mine[:copy(mine, []byte{0x91, 0xdd, 0x00, 0x00, 0x00, 0x01, 0x05})] // [[5]], the inner list an array32
	var stop atomic.Bool
	flipping := make(chan struct{})
	go func() {
		defer close(flipping)
		for !stop.Load() {
			senders[2] ^= 0x01
		}
	}()
	big := 0
	for range 2000 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		decodeArgs(typ, Message{Payload: payload})
		runtime.ReadMemStats(&after)
		if after.TotalAlloc-before.TotalAlloc > 16<<20 {
			big++
		}
	}
	stop.Store(true)
	<-flipping
	if big > 0 {
		t.Fatalf("%d of 2000 decodes allocated a claim the check had refused", big)
	}
}

package core

import (
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
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

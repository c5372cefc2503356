package wire

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestPartsConcatenateToTheEncoding(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 3*inlineBytes)
	cases := []struct {
		name   string
		frame  Frame
		pieces int // the most pieces expected: big strings are referenced
	}{
		{"empty", Frame{Kind: FrameRequest}, 1},
		{"small", Frame{Kind: FrameRequest, ID: 9, Method: "m", Payload: []byte("hi"), Buffers: [][]byte{[]byte("x")}}, 1},
		{"big payload", Frame{Kind: FrameChunk, ID: 3, Offset: 5, Payload: big}, 3},
		{"big buffers", Frame{Kind: FrameResponse, Payload: []byte("p"), Buffers: [][]byte{big, []byte("s"), big}, Refs: []RefOp{{}}, Sizes: []int64{1, 2}}, 5},
	}
	var p Parts
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, err := msgpack.Marshal(&c.frame)
			if err != nil {
				t.Fatal(err)
			}
			pieces, total, err := p.Encode(&c.frame)
			if err != nil {
				t.Fatal(err)
			}
			got := bytes.Join(pieces, nil)
			if !bytes.Equal(got, want) || total != len(want) {
				t.Fatalf("pieces join to %d bytes (total %d), want the %d of EncodeMsgpack", len(got), total, len(want))
			}
			if len(pieces) > c.pieces {
				t.Fatalf("%d pieces, want at most %d", len(pieces), c.pieces)
			}
		})
	}
}

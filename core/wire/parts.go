package wire

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// inlineBytes is the size under which EncodeParts copies a byte string into the frame's
// encoding rather than referencing it: a piece of its own costs more than copying it.
const inlineBytes = 4096

// Parts is a frame's encoding in pieces: concatenated in order they are what EncodeMsgpack
// writes. The frame's big byte strings (payload, buffers) are referenced, not copied, so a
// transport that moves the pieces into memory of its own copies them once.
type Parts struct {
	scratch    bytes.Buffer
	marks      []partMark
	pieces     [][]byte
	referenced []bool
	enc        *msgpack.Encoder
}

// partMark is one piece: scratch[start:end], or data when data is set.
type partMark struct {
	start, end int
	data       []byte
}

// Encode encodes f into p, replacing what p held, and returns the pieces and their total
// length. The pieces are valid until the next Encode.
func (p *Parts) Encode(f *Frame) ([][]byte, int, error) {
	p.scratch.Reset()
	p.marks = p.marks[:0]
	if p.enc == nil {
		p.enc = msgpack.NewEncoder(&p.scratch)
	} else {
		p.enc.Reset(&p.scratch)
	}
	start := 0
	cut := func(data []byte) {
		p.marks = append(p.marks, partMark{start: start, end: p.scratch.Len()}, partMark{data: data})
		start = p.scratch.Len()
	}
	enc := p.enc
	bytesField := func(b []byte) error {
		if len(b) < inlineBytes {
			return enc.EncodeBytes(b)
		}
		if err := enc.EncodeBytesLen(len(b)); err != nil {
			return err
		}
		cut(b)
		return nil
	}
	if err := f.encodeHead(enc); err != nil {
		return nil, 0, err
	}
	if err := bytesField(f.Payload); err != nil {
		return nil, 0, err
	}
	if err := enc.EncodeArrayLen(len(f.Buffers)); err != nil {
		return nil, 0, err
	}
	for _, b := range f.Buffers {
		if err := bytesField(b); err != nil {
			return nil, 0, err
		}
	}
	if err := f.encodeTail(enc); err != nil {
		return nil, 0, err
	}
	p.marks = append(p.marks, partMark{start: start, end: p.scratch.Len()})
	p.pieces, p.referenced = p.pieces[:0], p.referenced[:0]
	total := 0
	all := p.scratch.Bytes()
	for _, m := range p.marks {
		piece := m.data
		if piece == nil {
			piece = all[m.start:m.end]
		}
		if len(piece) > 0 {
			p.pieces = append(p.pieces, piece)
			p.referenced = append(p.referenced, m.data != nil)
			total += len(piece)
		}
	}
	return p.pieces, total, nil
}

// Referenced reports whether piece i of the last Encode is the frame's own memory (a big byte
// string), not the encoder's: it is valid for as long as the frame's memory is.
func (p *Parts) Referenced(i int) bool { return p.referenced[i] }

package shmtransport

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// TestAFrameCutShortIsNotMalformed: a frame bigger than the ring is decoded as it comes; one
// whose peer stops partway (gone, or the stream closed) is reported as why the wait ended, not
// as a malformed frame (which the worker would log as a peer that broke the protocol).
func TestAFrameCutShortIsNotMalformed(t *testing.T) {
	var p wire.Parts
	pieces, total, _ := p.Encode(&wire.Frame{Kind: wire.FrameRequest, ID: 7, Payload: make([]byte, 4*MinRingBytes)})
	encoded := binary.LittleEndian.AppendUint32(nil, uint32(total))
	for _, piece := range pieces {
		encoded = append(encoded, piece...)
	}
	mem := fuzzRegion()
	rg := ringAt(mem, laneSmall, 0, MinRingBytes)
	written := copy(rg.data, encoded[:MinRingBytes/2])
	rg.ctrl.head.Store(uint64(written))
	peerGone := errors.New("the peer is gone")
	r := &ringReader{r: rg, sleep: func() error { return peerGone }}
	_, err := r.readFrame(msgpack.NewDecoder(nil), nil)
	if !errors.Is(err, peerGone) || errors.Is(err, transport.ErrMalformed) {
		t.Fatalf("readFrame: %v; want %v, not a malformed frame", err, peerGone)
	}
}

// Package wire is what tensorplay-rpc agents say to each other: the Frame every transport
// carries, its msgpack encoding, and the reference operations of the RRef protocol. Everything
// a peer sends is untrusted: the decoder bounds every length before it allocates.
package wire

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// FrameKind says what a Frame is for.
type FrameKind uint8

// Frame kinds.
const (
	// FrameHello opens a stream: its payload is the caller's Hello.
	FrameHello FrameKind = iota + 1
	// FrameRequest asks the callee to run Method.
	FrameRequest
	// FrameResponse answers the request with the same ID.
	FrameResponse
	// FrameRefs carries RRef reference operations to their owner; back from the owner, with
	// none, it acknowledges them (RefSeq).
	FrameRefs
	// FrameChunk carries Payload bytes at Offset of the chunked message ID.
	FrameChunk
	// FrameAbort says the rest of the chunked message ID will not come.
	FrameAbort
)

// ReplyStatus is the outcome a response frame carries.
type ReplyStatus uint8

// Response statuses.
const (
	// ReplyOK means the handler replied with a Message.
	ReplyOK ReplyStatus = iota
	// ReplyHandlerError means the handler failed; Error says why and Payload may describe it.
	ReplyHandlerError
	// ReplyNoHandler means the callee has no handler for the method.
	ReplyNoHandler
	// ReplyTooLarge means the handler's reply was over the callee's size limit.
	ReplyTooLarge
	// RefsGap, on a FrameRefs back from an owner, says it refused operations that would have
	// left a gap after RefSeq, the last it applied: the sender sends again all after it.
	RefsGap
)

// Frame is the unit on the wire, encoded as a msgpack array (frame_codec.go).
type Frame struct {
	Kind FrameKind
	ID   uint64
	// Method names the handler of a request.
	Method string
	// TimeoutMs is the caller's remaining budget for a request; 0 means none.
	TimeoutMs int64
	Status    ReplyStatus
	Error     string
	Payload   []byte
	Buffers   [][]byte
	Refs      []RefOp
	// Sizes, on a request or response whose data follows in chunks, gives the length of the
	// payload and of each buffer; the chunks carry them back to back.
	Sizes []int64
	// Offset is where a chunk's bytes go in its message.
	Offset int64
	// RefSeq numbers reference operations, per (sender, owner) pair from 1, so an owner applies
	// each once and in order even when they are sent again on a new stream. On a frame that
	// carries Refs to their owner it is the number of Refs[0]; on a frame back from the owner
	// (a response, or a FrameRefs with no Refs) it acknowledges every operation up to it.
	RefSeq uint64

	// Sink, set by a stream's reader before decoding, gives the memory a chunk's bytes go to,
	// so they are decoded in place (see ChunkSink).
	Sink ChunkSink

	placed  bool     // the chunk's bytes went through Sink
	dropped int      // the length of a placed chunk whose bytes were dropped
	pooled  [][]byte // memory from the shared pool that Payload and Buffers were decoded into

	landing        []byte // where the peer writes the chunks of the message this header opens
	landingRelease func()
}

// SetLanding, on the header of a big message (Sizes set), says that the peer writes the
// message's chunks into mem (its Sizes' total bytes, back to back) as it sends them, so the
// message may be reassembled in mem itself; release hands mem back when nothing reads it any
// more, once however often it is called. A stream reader sets it (a shared-memory transport);
// whoever takes the frame must take the landing too (TakeLanding) and release it.
func (f *Frame) SetLanding(mem []byte, release func()) {
	f.landing, f.landingRelease = mem, release
}

// TakeLanding hands over the landing SetLanding set: nil, nil if none.
func (f *Frame) TakeLanding() (mem []byte, release func()) {
	mem, release = f.landing, f.landingRelease
	f.landing, f.landingRelease = nil, nil
	return mem, release
}

// ChunkSink is where a stream's reader wants chunk bytes decoded to: dst, or nowhere (dst nil
// and ok set) for a message being dropped; ok unset refuses the chunk, failing the decode.
type ChunkSink func(id uint64, offset int64, n int) (dst []byte, ok bool)

// Placed reports whether a decoded chunk's bytes went through its Sink (placed or dropped),
// and how many there were.
func (f *Frame) Placed() (n int, ok bool) {
	return len(f.Payload) + f.dropped, f.placed
}

// Limits every peer is held to.
const (
	// MaxFrameBytes bounds one encoded frame: bigger data travels in chunks, so a peer that
	// announces more is refused before anything is allocated.
	MaxFrameBytes = 16 << 20
	// MaxBuffersPerMessage bounds the buffers (and refs, and sizes) one message announces.
	MaxBuffersPerMessage = 1 << 16
)

// Hello is what a caller says of itself when it opens a stream.
type Hello struct {
	_msgpack struct{} `msgpack:",as_array"`
	Name     string
	Rank     int
	// Epoch tells which member of that rank speaks: in a dynamic world a worker that leaves
	// and joins again is a new member (core's member epoch); always 0 in a static one.
	Epoch uint64
}

// HelloFrame is the frame that opens a stream from the worker name of rank rank, the member
// of that rank that joined at epoch.
func HelloFrame(name string, rank int, epoch uint64) *Frame {
	payload, _ := msgpack.Marshal(&Hello{Name: name, Rank: rank, Epoch: epoch}) // cannot fail for a string and integers
	return &Frame{Kind: FrameHello, Payload: payload}
}

// maxHelloName bounds the name a Hello may carry (a worker's name is shorter than 128
// characters; the rules are checked by whoever reads it).
const maxHelloName = 1024

// Hello reads the Hello a FrameHello carries, by hand as the frame itself (see codec.go).
func (f *Frame) Hello() (Hello, error) {
	var h Hello
	dec := msgpack.NewDecoder(bytes.NewReader(f.Payload))
	if err := decodeArrayOf(dec, "hello", 3); err != nil {
		return h, err
	}
	var err error
	if h.Name, err = decodeString(dec, "worker name", maxHelloName); err != nil {
		return h, err
	}
	if h.Rank, err = dec.DecodeInt(); err != nil {
		return h, err
	}
	h.Epoch, err = dec.DecodeUint64()
	return h, err
}

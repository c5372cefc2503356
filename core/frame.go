package core

// FrameKind says what a Frame is for.
type FrameKind uint8

// Frame kinds.
const (
	// FrameHello opens a stream: the caller says who it is.
	FrameHello FrameKind = iota + 1
	// FrameRequest asks the callee to run Method.
	FrameRequest
	// FrameResponse answers the request with the same ID.
	FrameResponse
	// FrameRefs carries RRef reference operations to their owner; it has no reply.
	FrameRefs
	// FrameChunk carries Payload bytes at Offset of the chunked message ID.
	FrameChunk
	// FrameAbort says the rest of the chunked message ID will not come.
	FrameAbort
)

// Status is the outcome carried by a response frame.
type Status uint8

// Response statuses.
const (
	// StatusOK means the handler replied with a Message.
	StatusOK Status = iota
	// StatusHandlerError means the handler failed; Error says why and Payload may describe it.
	StatusHandlerError
	// StatusNoHandler means the callee has no handler for the method.
	StatusNoHandler
	// StatusTooLarge means the handler's reply was over the callee's size limit.
	StatusTooLarge
)

// Frame is the unit on the wire, encoded as a msgpack array (frame_codec.go).
type Frame struct {
	Kind FrameKind
	ID   uint64
	// Method names the handler (requests) or the caller's name (hello).
	Method string
	// TimeoutMs is the caller's remaining budget for a request; 0 means none.
	TimeoutMs int64
	// CallerID is the caller's worker id (hello).
	CallerID int
	Status   Status
	Error    string
	Payload  []byte
	Buffers  [][]byte
	Refs     []RefOp
	// Sizes, on a request or response whose data follows in chunks, gives the length of the
	// payload and of each buffer; the chunks carry them back to back.
	Sizes []int64
	// Offset is where a chunk's bytes go in its message.
	Offset int64

	// chunkSink, set by a stream's reader before decoding, gives the memory a chunk's bytes
	// go to; sunk says they went there.
	chunkSink chunkSink
	sunk      bool
	dropped   int // the length of a sunk chunk whose bytes were dropped
}

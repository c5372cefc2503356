// Package transport is how agents reach each other: the Transport and Stream interfaces every
// transport implements (shared memory on one host, package shmtransport; gRPC between hosts,
// package grpctransport), the Chooser that picks one per peer, and an in-memory one for tests
// ([InmemNetwork]).
package transport

import (
	"context"
	"errors"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// Transport carries frames between agents. Implementations: the gRPC transport of real worlds
// (package grpctransport) and an in-memory one for tests ([InmemNetwork]).
type Transport interface {
	// Listen starts accepting streams on host and returns the address peers dial. For each
	// incoming stream the transport calls serve, which returns when the stream is over.
	Listen(host string, serve func(Stream)) (addr string, err error)
	// Dial opens a stream to the agent listening at addr.
	Dial(ctx context.Context, addr string) (Stream, error)
	// Close stops listening and breaks every stream of this transport.
	Close() error
}

// Stream is one bidirectional frame stream. Send and Recv may run concurrently with each
// other, but Send must not be called concurrently with itself (nor Recv with itself).
type Stream interface {
	Send(f *wire.Frame) error
	// Recv returns the next frame, or an error once the stream is broken or closed.
	Recv() (*wire.Frame, error)
	// Close ends the stream; the peer's Recv then fails.
	Close() error
}

// Laned is implemented by streams that carry the frames of big messages (see Bulk) in a lane
// of their own: a small frame is not held behind them, and Send may run for a bulk frame and
// another frame at once. Frames within a lane keep their order; across lanes they may not,
// except that an accepted stream's first frame, if it is not Bulk, is the first Recv returns
// (a hello is not overtaken by the big message sent right after it).
type Laned interface {
	Stream
	BulkLane()
}

// Lending is implemented by streams whose peer may read a sent frame's big byte strings from
// the sender's memory after Send returns (shared memory between processes, read across them):
// the sender keeps the memory of a big message's chunks unchanged until the wait Settled gave
// returns, or until it has called Revoke.
type Lending interface {
	Stream
	// Settled returns at once a wait that returns once the peer has read every chunk sent
	// before Settled was called (not those sent after: a message's memory is not held for the
	// next one's chunks); if it cannot (the stream ended: the error says why), the wait revokes
	// what was lent before it returns.
	Settled() (wait func() error)
	// Revoke takes back everything lent: the peer discards a frame it read from lent memory
	// from now on (and ends the stream), so the memory may be reused at once. For a stream
	// that is ending.
	Revoke()
	// ChunkBytes is how long the chunks of a big message sent now should be, or 0 for the
	// sender's own length: a peer that reads chunks from the sender's memory reads a long one
	// in one go, so fewer, longer chunks cost it fewer wake-ups.
	ChunkBytes() int
}

// SelfReading is implemented by streams that a thread may read for itself: a thread waiting
// for a reply (the peer then wakes that thread directly, instead of a reader goroutine that
// wakes it in turn: a thread hand-off saved per reply), or an idle thread that serves the
// requests it reads. Frames of the small lane only (not Bulk): a big message's stay with Recv.
// Recv and RecvWaiting may run at once (each frame goes to one), but RecvWaiting must not run
// concurrently with itself. Small frames are handled in the order they came: RecvWaiting does
// not read while Recv's reader holds a small frame it has not handled (until it calls Recv
// again).
type SelfReading interface {
	Stream
	// RecvWaiting waits up to d for the next small frame unless stop reports true (checked
	// before each sleep; Interrupt wakes a sleep to check it again) and hands it to handle
	// before any reader reads another. It reports whether it handled one, and ErrBusy at once
	// if another reads the stream, Recv's reader holds a small frame, or the next frame is one
	// Recv must read: the caller then waits for Recv's reader.
	RecvWaiting(d time.Duration, stop func() bool, handle func(*wire.Frame)) (bool, error)
	// Interrupt wakes a RecvWaiting asleep, to check its stop again.
	Interrupt()
}

// ErrBusy is what RecvWaiting reports when the stream is another reader's to read now.
var ErrBusy = errors.New("another reader reads the stream")

// Bulk reports whether f belongs in a big message's lane: its header (it gives the sizes of the
// data to come), its chunks, or its abort.
func Bulk(f *wire.Frame) bool {
	return f.Kind == wire.FrameChunk || f.Kind == wire.FrameAbort || len(f.Sizes) > 0
}

// PeerIdentity is what a transport knows of who opened a stream it accepted.
type PeerIdentity struct {
	// Addr is where the stream came from: "host:port" for network transports, the address
	// the dialing transport listens on for the in-memory one; "" if unknown.
	Addr string
	// Names are the names the peer's TLS certificate carries (common name and DNS names).
	Names []string
	// HostAddrPrefix, for streams from this host's shared memory, starts the address of
	// every worker that could have opened one: a peer here can only be a worker registered
	// with a shared-memory address on this host.
	HostAddrPrefix string
}

// IdentifiedStream is implemented by accepted streams whose transport knows who opened them.
type IdentifiedStream interface {
	Identity() PeerIdentity
}

// SinkSetter is implemented by streams that decode frames themselves, so the receiver can
// have chunks decoded straight into the messages they belong to.
type SinkSetter interface {
	SetChunkSink(wire.ChunkSink)
}

// Prober is implemented by transports that can tell a worker that is gone from one that
// cannot be reached for now: a killed process's host refuses connections to its address at
// once, while a cut link or a frozen host gives no answer at all, and a worker must not lose
// its RRefs to a blip.
type Prober interface {
	// Probe returns nil if an agent listens at addr, an error wrapping ErrGone if addr's host
	// answered that none does, and another error if there was no telling.
	Probe(ctx context.Context, addr string) error
}

// ErrGone is what Probe reports when a worker's host says nothing listens at its address.
var ErrGone = errors.New("nothing listens there any more")

// ErrClosed is what a stream or transport closed locally reports.
var ErrClosed = errors.New("closed")

// ErrMalformed is wrapped by what Recv reports when the peer sent bytes that are no frame (or
// shared-memory rings it broke): unlike a stream that ends, it is the peer's fault, and logged.
var ErrMalformed = errors.New("the peer sent what is not a frame")

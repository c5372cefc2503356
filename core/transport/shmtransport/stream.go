package shmtransport

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/futex"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"
)

// stream is one stream over a shared region. The Unix socket it was set up on stays open for
// its life: wake-up bytes travel on it (so a sleeping reader waits in Go's network poller and
// holds no thread), and its end is how each side learns the other is gone, dead or alive.
//
// Frames travel in two lanes, each a ring per direction: the frames of big messages in one
// (transport.Bulk), every other frame in the other. A small call is then never queued behind
// megabytes of a transfer to the same peer that its reader has yet to copy out (measured: a
// small call during the first 256 MiB transfer of a process took 20 ms behind a full 4 MiB
// ring drained at page-fault speed; two lanes bound the wait by one bulk frame).
type stream struct {
	conn   *net.UnixConn
	mem    []byte
	lender *lender
	lanes  [2]lane
	// placer writes big messages into the landing area of the outgoing direction
	// (placing.go); used under the bulk lane's sendMu.
	placer *placer
	// next is the lane Recv looks at first: the lanes take turns when both have a frame.
	next int
	// helloFirst, on an accepted stream until Recv returns its first frame, keeps the bulk
	// lane unread: the dialer's opening frame (its hello, on the small lane) must not be
	// overtaken by a big message it sent right after it, which a look at the small lane a
	// moment before both were written would let through.
	helloFirst bool
	// peer names the other end for errors.
	peer string
	// hostAddrPrefix starts the addresses of this host's shared-memory listeners.
	hostAddrPrefix string

	sink wire.ChunkSink

	// readMu is held while a lane is read (by Recv, or a thread in RecvWaiting), never while
	// its reader sleeps, and not while Recv reads a bulk frame (the bulk lane is Recv's
	// alone). threadWaits says a thread sleeps at the small lane's doorbell: a frame there
	// wakes it, not the reader goroutine.
	readMu      sync.Mutex
	threadWaits atomic.Bool
	// threadPoll and readerPoll are how long a thread reading for itself and the reader
	// goroutine poll the rings before they sleep (spinWait; tests set them apart).
	threadPoll, readerPoll time.Duration
	// heldSmall, under readMu, says Recv returned a small-lane frame its reader has not
	// handled yet (it has not called Recv again): a thread must not read the next one, which
	// it would handle first. A bulk-lane frame held up (a big message waiting for memory)
	// does not stop a thread: the lanes are not ordered with each other.
	heldSmall bool

	// silence is the peer's heartbeat as tend last saw it (liveness.go).
	silence peerSilence

	gone atomic.Pointer[error] // why the stream ended, once it has
	done chan struct{}         // closed by Close

	mu       sync.Mutex
	users    int // Send and Recv calls under way: the region stays mapped until they end
	closed   bool
	unmapped bool
	onClose  func()
}

// lane is one lane of a stream: a ring each way.
type lane struct {
	sendMu sync.Mutex   // one Send at a time per lane
	idle   laneIdleness // how long it has sent nothing, as tend sees it (idle.go)
	out    ringWriter
	parts  wire.Parts
	in     ringReader // read by Recv only
	dec    *msgpack.Decoder
}

var (
	_ transport.SinkSetter       = (*stream)(nil)
	_ transport.IdentifiedStream = (*stream)(nil)
	_ transport.Laned            = (*stream)(nil)
	_ transport.Lending          = (*stream)(nil)
	_ transport.SelfReading      = (*stream)(nil)
)

// BulkLane implements transport.Laned.
func (s *stream) BulkLane() {}

// Identity implements transport.IdentifiedStream: an accepted stream comes from this host.
func (s *stream) Identity() transport.PeerIdentity {
	return transport.PeerIdentity{HostAddrPrefix: s.hostAddrPrefix}
}

// newStream runs over mem, writing direction out of each lane and reading direction 1-out;
// lender is the peer's process if this side reads what it lends (nil: it does not), which the
// stream then owns; takeLandings says whether it takes big messages the peer writes into its
// landing area.
func newStream(conn *net.UnixConn, mem []byte, ringBytes, out int, lender *lender, takeLandings bool, peer string) *stream {
	s := &stream{conn: conn, mem: mem, lender: lender, peer: peer, done: make(chan struct{}), threadPoll: spinWait, readerPoll: spinWait}
	s.placer = newPlacer(landingArea(mem, out, ringBytes), ringAt(mem, laneBulk, out, ringBytes).ctrl)
	for i := range s.lanes {
		l := &s.lanes[i]
		l.out = ringWriter{r: ringAt(mem, i, out, ringBytes), wake: s.wakePeer, broken: s.broken}
		// The reader checks only whether the stream ended: it learns of the peer's death from
		// its own read of the socket, so it needs no poll of it on every wait.
		l.in = ringReader{r: ringAt(mem, i, 1-out, ringBytes), sleep: s.sleep, broken: s.goneErr, lender: lender}
		l.dec = msgpack.NewDecoder(nil)
	}
	if takeLandings {
		in := &s.lanes[laneBulk].in
		in.area = landingArea(mem, 1-out, ringBytes)
		in.land = func(slot int) func() { return s.landingHold(in.r.ctrl, slot) }
		in.r.ctrl.readsLandings.Store(1)
	}
	return s
}

func (s *stream) SetChunkSink(sink wire.ChunkSink) { s.sink = sink }

// Send writes f into the outgoing ring of its lane.
func (s *stream) Send(f *wire.Frame) error {
	if !s.enter() {
		return s.ended()
	}
	defer s.leave()
	l := &s.lanes[laneSmall]
	if transport.Bulk(f) {
		l = &s.lanes[laneBulk]
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	pieces, total, err := l.parts.Encode(f)
	if err != nil {
		return err
	}
	if total > wire.MaxFrameBytes {
		return fmt.Errorf("frame of %d bytes is over the limit of %d", total, wire.MaxFrameBytes)
	}
	switch {
	case l == &s.lanes[laneSmall]:
		err = l.out.write(pieces, total)
	case len(f.Sizes) > 0:
		if landing, ok := s.placer.begin(f); ok {
			err = l.out.writeLandingHeader(pieces, total, landing)
		} else {
			err = l.out.write(pieces, total)
		}
	case f.Kind == wire.FrameChunk:
		if at, ok := s.placer.place(f); ok {
			err = l.out.writePlacedChunk(pieces, f.Payload, at, total)
		} else if l.out.r.ctrl.readsLender.Load() == 1 {
			err = l.out.writeLending(pieces, l.parts.Referenced, total)
		} else {
			err = l.out.write(pieces, total)
		}
	default:
		if f.Kind == wire.FrameAbort {
			s.placer.forget(f.ID)
		}
		err = l.out.write(pieces, total)
	}
	if err != nil {
		return s.fail(err)
	}
	return nil
}

// Settled implements transport.Lending: the wait returns once the peer has read every chunk
// sent so far, from the ring or from this process's memory.
func (s *stream) Settled() func() error {
	out := &s.lanes[laneBulk].out
	lentTo := out.lentTo.Load()
	return func() error {
		if !s.enter() {
			return s.ended()
		}
		defer s.leave()
		// The wait holds no lock: the writer goes on sending while an earlier message settles.
		if err := out.settle(lentTo); err != nil {
			return s.fail(err) // closing revokes what was lent
		}
		return nil
	}
}

// Revoke implements transport.Lending.
func (s *stream) Revoke() {
	if s.enter() {
		s.revoke()
		s.leave()
	}
}

// ChunkBytes implements transport.Lending: long chunks once the peer reads them from this
// process's memory.
func (s *stream) ChunkBytes() int {
	if !s.enter() {
		return 0
	}
	defer s.leave()
	// Not for landings alone: where lending is off, a message too big for a landing goes
	// through the ring, in the agent's chunks.
	if s.lanes[laneBulk].out.r.ctrl.readsLender.Load() == 1 {
		return LentChunkBytes
	}
	return 0
}

// revoke tells the peer that what this side lent may be reused; the region must be mapped.
func (s *stream) revoke() { s.lanes[laneBulk].out.r.ctrl.revoked.Store(1) }

// ringDoorbell rings a doorbell: a thread asleep at it wakes, and one about to sleep finds the
// word changed and does not.
func ringDoorbell(bell *atomic.Uint32) {
	bell.Add(1)
	futex.WakeAll(bell)
}

// wakePeer wakes the peer's sleeping reader as it asked: a thread at its doorbell, or the
// reader goroutine with a byte on the socket.
func (s *stream) wakePeer(how uint32) error {
	if how == readerOnDoorbell {
		ringDoorbell(&s.lanes[laneSmall].out.r.ctrl.doorbell)
		return nil
	}
	_, err := s.conn.Write([]byte{1})
	if err != nil {
		return fmt.Errorf("wake %s: %w", s.peer, err)
	}
	return nil
}

// ended is why the stream ended, once it has.
func (s *stream) ended() error {
	if err := s.goneErr(); err != nil {
		return err
	}
	return transport.ErrClosed
}

// goneErr says why the stream ended, or nil while it goes on.
func (s *stream) goneErr() error {
	if e := s.gone.Load(); e != nil {
		return *e
	}
	return nil
}

// broken says why the stream cannot go on, or nil. A producer waiting for room calls it every
// wait slice: the peer's socket hanging up means it is gone even if nobody reads the socket.
func (s *stream) broken() error {
	if err := s.goneErr(); err != nil {
		return err
	}
	if s.peerHungUp() {
		return s.fail(fmt.Errorf("%s is gone", s.peer))
	}
	return nil
}

// peerHungUp polls the socket, without reading it, for the peer's end.
func (s *stream) peerHungUp() bool {
	raw, err := s.conn.SyscallConn()
	if err != nil {
		return true
	}
	hung := false
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			hung = fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return hung
}

// fail ends the stream for err (the first reason wins) and returns the reason.
func (s *stream) fail(err error) error {
	s.gone.CompareAndSwap(nil, &err)
	s.Close()
	return *s.gone.Load()
}

func (s *stream) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.users++
	return true
}

// leave ends a use of the region; the last one after Close unmaps it.
func (s *stream) leave() {
	s.mu.Lock()
	s.users--
	last := s.closed && s.users == 0 && !s.unmapped
	if last {
		s.unmapped = true
	}
	s.mu.Unlock()
	if last {
		unix.Munmap(s.mem)
		s.placer.unmapped()
		s.lender.close()
	}
}

// Close ends the stream: the peer's reader sees the socket end, a local producer waiting for
// room wakes, and the region is unmapped once no Send or Recv uses it.
func (s *stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	// The reason goes first: a Send or Recv refused from now on must find it.
	closedErr := error(transport.ErrClosed)
	s.gone.CompareAndSwap(nil, &closedErr)
	// Before anyone can find the stream closed (a settle wait, then give lent memory back).
	s.revoke()
	s.closed = true
	s.users++ // this Close uses the region to wake a waiting producer
	onClose := s.onClose
	s.mu.Unlock()
	close(s.done)
	s.conn.Close()
	for i := range s.lanes {
		ctrl := s.lanes[i].out.r.ctrl
		ctrl.spaceSeq.Add(1)
		futex.WakeAll(&ctrl.spaceSeq)
	}
	ringDoorbell(&s.lanes[laneSmall].in.r.ctrl.doorbell) // a thread reading for itself
	s.leave()
	if onClose != nil {
		onClose()
	}
	return nil
}

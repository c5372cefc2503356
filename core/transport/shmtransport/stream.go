package shmtransport

import (
	"errors"
	"fmt"
	"net"
	"os"
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
	sendMu sync.Mutex // one Send at a time per lane
	sends  atomic.Uint64
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
	l.sends.Add(1)
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

// Recv reads the next frame from whichever lane has one, taking turns when both have.
func (s *stream) Recv() (*wire.Frame, error) {
	if !s.enter() {
		return nil, s.ended()
	}
	defer s.leave()
	s.readMu.Lock()
	defer s.readMu.Unlock()
	s.heldSmall = false // the caller has handled what Recv returned last
	l, err := s.readyLane()
	if err != nil {
		return nil, s.fail(fmt.Errorf("from %s: %w", s.peer, err))
	}
	var f *wire.Frame
	if l == &s.lanes[laneBulk] {
		// A bulk frame is long to read (a lent chunk is copied from the peer's memory, up to a
		// millisecond): meanwhile a thread reading for itself may take the small lane's frames
		// (RecvWaiting touches no other), or small calls would wait behind every chunk. Only
		// Recv reads the bulk lane.
		s.readMu.Unlock()
		f, err = l.in.readFrame(l.dec, s.sink)
		s.readMu.Lock()
	} else {
		f, err = l.in.readFrame(l.dec, s.sink)
	}
	if err != nil {
		return nil, s.fail(fmt.Errorf("from %s: %w", s.peer, err))
	}
	s.helloFirst = false
	s.heldSmall = l == &s.lanes[laneSmall]
	return f, nil
}

// readyLane waits until a lane has a frame to read and returns it. It holds readMu but while
// it sleeps.
func (s *stream) readyLane() (*lane, error) {
	polled := false
	for {
		if err := s.goneErr(); err != nil {
			return nil, err
		}
		for k := range s.lanes {
			i := (s.next + k) % len(s.lanes)
			ok, err := s.lanes[i].in.ready()
			if err != nil {
				return nil, err
			}
			if ok && !(s.helloFirst && i == laneBulk) {
				s.next = 1 - i
				return &s.lanes[i], nil
			}
		}
		if !polled {
			// In a burst the next frame is tens of microseconds away: poll for it (spinWait)
			// before asking for a wake-up byte, which costs the producer a system call and
			// this goroutine a reschedule. Without readMu: a thread may read for itself.
			polled = true
			var seen [len(s.lanes)]uint64
			for i := range s.lanes {
				s.lanes[i].in.release()
				seen[i] = s.lanes[i].in.head
			}
			s.readMu.Unlock()
			s.poll(s.readerPoll, func() bool {
				for i := range s.lanes {
					if s.lanes[i].in.r.ctrl.head.Load() != seen[i] {
						return true
					}
				}
				return false
			}, func() bool { return false })
			s.readMu.Lock()
			continue
		}
		// Nothing whole on either lane: give back all room (a producer may wait for it), ask
		// for a wake-up byte (the small lane rings the doorbell instead while a thread waits
		// there: it reads that lane itself), and sleep unless a producer wrote meanwhile.
		changed := false
		for i := range s.lanes {
			in := &s.lanes[i].in
			in.release()
			how := s.sleepsAs(i)
			in.r.ctrl.readerAsleep.Store(how)
			if how == readerOnDoorbell && !s.threadWaits.Load() {
				in.r.ctrl.readerAsleep.Store(readerOnSocket) // the thread handed back meanwhile
			}
			changed = changed || in.changed()
		}
		if !changed {
			s.readMu.Unlock()
			err := s.sleep()
			s.readMu.Lock()
			if err != nil {
				return nil, err
			}
		}
		// Awake: a producer that clears a flag still set sends a byte nobody waits for.
		for i := range s.lanes {
			if s.sleepsAs(i) == readerOnSocket {
				s.lanes[i].in.r.ctrl.readerAsleep.Store(0)
			}
		}
	}
}

// sleepsAs is how the reader of lane i sleeps: in the doorbell's futex while a thread waits
// there for the small lane, else on the socket. Called with readMu held.
func (s *stream) sleepsAs(i int) uint32 {
	if i == laneSmall && s.threadWaits.Load() {
		return readerOnDoorbell
	}
	return readerOnSocket
}

// RecvWaiting implements transport.SelfReading. Nothing in it waits for the peer but the
// doorbell, which is bounded by d: not the socket, not a frame the peer has yet to finish, not
// the peer's memory, not the reader goroutine.
func (s *stream) RecvWaiting(d time.Duration, stop func() bool, handle func(*wire.Frame)) (bool, error) {
	if !s.enter() {
		return false, s.ended()
	}
	defer s.leave()
	if !s.readMu.TryLock() {
		return false, transport.ErrBusy
	}
	locked, registered := true, false
	defer func() {
		if registered { // stop panicked: the wake-ups must not stay with a thread that left
			s.handBack()
		}
		if locked {
			s.readMu.Unlock()
		}
	}()
	l := &s.lanes[laneSmall]
	in := &l.in
	bell := &in.r.ctrl.doorbell
	deadline := time.Now().Add(d)
	// Once this thread has asked for the small lane's wake-ups, frames may come that woke
	// only it.
	askedForWakeUps, spun := false, false
	for {
		if err := s.goneErr(); err != nil {
			return false, err
		}
		if s.heldSmall {
			// Recv's reader holds a small frame it has not handled: the next comes after it.
			return false, transport.ErrBusy
		}
		n, known, err := in.peek()
		if err != nil {
			return false, s.fail(fmt.Errorf("from %s: %w", s.peer, err))
		}
		if known && n > in.r.size-lengthBytes {
			// A frame too big for the ring streams through as it is read, with waits on the
			// socket between parts: the reader goroutine's to read, which may not know it came.
			s.kickReader()
			return false, transport.ErrBusy
		}
		if known && in.head-in.tail >= lengthBytes+n {
			f, err := s.readWhole(l)
			if err != nil {
				return false, s.fail(fmt.Errorf("from %s: %w", s.peer, err))
			}
			// The room goes back now: the reader goroutine, which gives it back before it
			// sleeps, may not wake for a long time.
			in.release()
			s.helloFirst = false
			if askedForWakeUps && in.r.ctrl.head.Load() != in.tail {
				// Frames written after the wake-up for this one, before this thread asked
				// for wake-ups to go to the reader goroutine again, woke nobody.
				s.kickReader()
			}
			// Under readMu: no reader reads the next frame before this one is handled.
			handle(f)
			return true, nil
		}
		left := time.Until(deadline)
		if left <= 0 || stop() {
			return false, nil
		}
		if !spun {
			spun = true
			if s.spinFor(in, min(left, s.threadPoll), stop) {
				// Frames that came while it polled woke no one: the reader goroutine is
				// kicked for those this thread leaves in the ring.
				askedForWakeUps = true
				continue
			}
		}
		seen := bell.Load()
		in.release()
		s.threadWaits.Store(true)
		askedForWakeUps, registered = true, true
		in.r.ctrl.readerAsleep.Store(readerOnDoorbell)
		// The stream's end rings the doorbell after it records why: one that came before
		// seen was loaded is seen here (Interrupt rings nothing on an ended stream).
		if in.changed() || stop() || s.goneErr() != nil {
			s.handBack()
			registered = false
			continue
		}
		s.readMu.Unlock()
		futex.Sleep(bell, seen, left)
		locked = s.readMu.TryLock()
		s.handBack()
		registered = false
		if !locked {
			// The reader goroutine reads, perhaps a frame that streams through with waits on
			// the socket: the lane is its now, with the frames that rang for this thread.
			s.kickReader()
			return false, transport.ErrBusy
		}
	}
}

// spinWait is how long a reader polls the rings before it sleeps: a thread reading for itself,
// before it sleeps at the doorbell, and the reader goroutine, before it sleeps on the socket.
// In a burst of calls, or a reply's round trip, the next frame comes within tens of
// microseconds, and a wake-up costs the peer a system call and the reader a reschedule (on a
// VM an interrupt to another CPU: 10-30 us). A reader polls only once it has read something,
// so an idle worker never polls.
const spinWait = 50 * time.Microsecond

// spinFor polls the small lane for up to d, yielding the CPU between looks, and reports
// whether a frame came. Meanwhile the lane asks for no wake-up: a producer that writes sees no
// one asleep and calls nothing, so the caller must kick the reader goroutine for frames it
// does not read itself. Called with readMu held.
func (s *stream) spinFor(in *ringReader, d time.Duration, stop func() bool) bool {
	if d <= 0 {
		return false
	}
	ctrl := in.r.ctrl
	ctrl.readerAsleep.Store(0)
	came := s.poll(d, in.changed, stop)
	// The reader goroutine may sleep on the socket: small frames wake it again, and one that
	// came as this stored the flag is read by the loop.
	ctrl.readerAsleep.Store(readerOnSocket)
	return came || in.changed()
}

// poll reports whether came() turned true within d, looking until stop() does or the stream
// ends, and yielding the CPU between looks (on two cores the peer may need this one).
func (s *stream) poll(d time.Duration, came, stop func() bool) bool {
	for start := time.Now(); time.Since(start) < d && !stop() && s.goneErr() == nil; {
		if came() {
			return true
		}
		_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
	return false
}

// readWhole reads the small lane's next frame, which peek found whole in the ring, as a
// thread reading for itself: a frame that is not what peek saw (its length changed meanwhile,
// it lends memory) or that belongs in the bulk lane is malformed. Called with readMu held.
func (s *stream) readWhole(l *lane) (*wire.Frame, error) {
	l.in.whole = true
	defer func() { l.in.whole = false }()
	// No chunk sink: big messages' chunks never travel in the small lane.
	f, err := l.in.readFrame(l.dec, nil)
	if err == nil && transport.Bulk(f) {
		// A big message's reassembly may wait for memory, which a waiting thread must not.
		err = fmt.Errorf("%w: a big message's frame came in the small lane", transport.ErrMalformed)
	}
	return f, err
}

// handBack gives the small lane's wake-ups back to the reader goroutine. It may run without
// readMu: readyLane looks at threadWaits again after it stores the flag.
func (s *stream) handBack() {
	s.threadWaits.Store(false)
	s.lanes[laneSmall].in.r.ctrl.readerAsleep.Store(readerOnSocket)
}

// Interrupt implements transport.SelfReading.
func (s *stream) Interrupt() {
	if s.enter() {
		ringDoorbell(&s.lanes[laneSmall].in.r.ctrl.doorbell)
		s.leave()
	}
}

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

// sleep waits for wake-up bytes, or a kick; the socket's end means the peer is gone.
func (s *stream) sleep() error {
	var buf [64]byte
	if _, err := s.conn.Read(buf[:]); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return s.conn.SetReadDeadline(time.Time{})
		}
		return s.fail(fmt.Errorf("%s is gone: %w", s.peer, err))
	}
	return nil
}

// kickReader wakes the reader goroutine asleep on the socket.
func (s *stream) kickReader() { s.conn.SetReadDeadline(time.Unix(1, 0)) }

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

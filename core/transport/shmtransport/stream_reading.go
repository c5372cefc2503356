package shmtransport

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/futex"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"golang.org/x/sys/unix"
)

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

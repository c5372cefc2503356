package tcptransport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"golang.org/x/sys/unix"
)

// A thread waiting for its reply (or an idle thread serving requests) reads the socket itself
// (transport.SelfReading): the kernel then wakes that thread when the frame comes, where
// Go's poller would wake the reader goroutine, which wakes the thread in turn; a thread
// hand-off saved each way (small-call p50 on this VM: 200 us before, see docs/performance.md).
//
// A thread takes only a whole small record that is already in the socket, one it can decode
// from a peek, and consumes it only once decoded: anything else (a chunk, a big message's
// header, a record still arriving, bytes Recv buffered) stays for Recv, which Go's poller
// wakes for it (socketReader). So no frame is ever handed between readers. Plain TCP only: a TLS stream's
// bytes must go through its record layer, which one reader owns.

// maxThreadRecord is the longest record a thread reads for itself: small frames of up to a
// few hundred KiB are common replies (their payload then goes to pooled memory).
const maxThreadRecord = 256 << 10

// peekBuffers hold what a reading thread peeks at: one per thread while it reads, not one per
// stream (a worker may have hundreds).
var peekBuffers = sync.Pool{New: func() any { b := make([]byte, lengthBytes+maxThreadRecord); return &b }}

// selfReadingStream is a stream threads may read for themselves.
type selfReadingStream struct{ *stream }

var _ transport.SelfReading = selfReadingStream{}

// rawSocket is the socket of a plain TCP stream as threads read it: by a descriptor of their
// own (a dup of the connection's, so Go's poller and its locks are not involved, and closing
// the connection cannot hand the number to another file while a thread uses it), with an
// eventfd that wakes a thread asleep in poll.
type rawSocket struct {
	rc syscall.RawConn

	mu     sync.Mutex
	fd     int // the dup'd socket
	wake   int // eventfd
	users  int // threads using fd and wake
	closed bool
}

// newRawSocket returns the raw socket of conn, or nil if conn is not plain TCP.
func newRawSocket(conn net.Conn) *rawSocket {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	fd := -1
	rc.Control(func(f uintptr) { fd, err = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) })
	if err != nil || fd < 0 {
		return nil
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(fd)
		return nil
	}
	return &rawSocket{rc: rc, fd: fd, wake: wake}
}

func (r *rawSocket) enter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.users++
	return true
}

func (r *rawSocket) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users--
	if r.closed && r.users == 0 {
		r.closeFiles()
	}
}

// close shuts the socket down (the connection's descriptor too: it is the same socket) and
// wakes a thread asleep on it; the descriptors go once no thread uses them.
func (r *rawSocket) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	unix.Shutdown(r.fd, unix.SHUT_RDWR)
	r.ring()
	if r.users == 0 {
		r.closeFiles()
	}
}

func (r *rawSocket) closeFiles() {
	unix.Close(r.fd)
	unix.Close(r.wake)
}

// ring wakes a thread asleep in poll. Called with mu held, or by a user.
func (r *rawSocket) ring() {
	one := [8]byte{1}
	unix.Write(r.wake, one[:])
}

// Interrupt implements transport.SelfReading.
func (s selfReadingStream) Interrupt() {
	if s.raw.enter() {
		s.raw.ring()
		s.raw.leave()
	}
}

// RecvWaiting implements transport.SelfReading. It waits for the socket up to d, in poll,
// unless stop reports true; nothing else in it waits.
func (s selfReadingStream) RecvWaiting(d time.Duration, stop func() bool, handle func(*wire.Frame)) (bool, error) {
	if !s.raw.enter() {
		return false, s.ended()
	}
	handled, err, broken := s.readWaiting(d, stop, handle)
	s.raw.leave()
	if broken != nil {
		return false, s.fail(broken)
	}
	return handled, err
}

// ended is why the stream ended.
func (s *stream) ended() error {
	select {
	case <-s.closed:
		return s.why
	default:
		return transport.ErrClosed
	}
}

// readWaiting is RecvWaiting between enter and leave: broken is why the stream must end.
func (s selfReadingStream) readWaiting(d time.Duration, stop func() bool, handle func(*wire.Frame)) (handled bool, err, broken error) {
	if !s.readMu.TryLock() {
		return false, transport.ErrBusy, nil
	}
	defer s.readMu.Unlock()
	deadline := time.Now().Add(d)
	for {
		select {
		case <-s.closed:
			return false, s.why, nil
		default:
		}
		if s.heldSmall || s.in.Buffered() > 0 || len(s.bulkFrames) > 0 {
			// Recv has a frame to hand out first (a bulk lane's, perhaps: lanes.go).
			return false, transport.ErrBusy, nil
		}
		f, next, err := s.takeWhole()
		switch {
		case err != nil:
			return false, nil, err
		case f != nil:
			// Under readMu: no reader reads the next frame before this one is handled.
			handle(f)
			return true, nil, nil
		case next == recordForRecv:
			return false, transport.ErrBusy, nil
		case next == recordHeartbeat:
			continue
		}
		left := time.Until(deadline)
		if left <= 0 || stop() {
			return false, nil, nil
		}
		fds := []unix.PollFd{{Fd: int32(s.raw.fd), Events: unix.POLLIN}, {Fd: int32(s.raw.wake), Events: unix.POLLIN}}
		ms := int((left + time.Millisecond - 1) / time.Millisecond)
		if _, err := unix.Poll(fds, ms); err != nil && err != unix.EINTR {
			return false, nil, fmt.Errorf("poll: %w", err)
		}
		if fds[1].Revents != 0 {
			var b [8]byte
			unix.Read(s.raw.wake, b[:])
		}
	}
}

// What takeWhole found in the socket, when it took no frame.
const (
	recordNone      = iota // nothing yet
	recordHeartbeat        // a heartbeat, taken
	recordForRecv          // a record a thread leaves to Recv
)

// takeWhole takes the next record from the socket if it is a whole small frame or a
// heartbeat. Called with readMu held and nothing buffered.
func (s selfReadingStream) takeWhole() (*wire.Frame, int, error) {
	r := s.raw
	var head [16]byte
	n, _, err := unix.Recvfrom(r.fd, head[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		return nil, recordNone, nil
	case err != nil:
		return nil, 0, readError(err)
	case n == 0:
		return nil, 0, readError(io.EOF)
	case n < lengthBytes:
		return nil, recordForRecv, nil
	}
	size := int(binary.BigEndian.Uint32(head[:]))
	whole := lengthBytes + size
	switch {
	case size == 0:
		if err := s.consume(head[:lengthBytes]); err != nil {
			return nil, 0, err
		}
		return nil, recordHeartbeat, nil
	case size > maxThreadRecord || isChunk(head[lengthBytes:n]):
		return nil, recordForRecv, nil
	}
	bp := peekBuffers.Get().(*[]byte)
	defer peekBuffers.Put(bp)
	peek := (*bp)[:whole]
	if n, _, err = unix.Recvfrom(r.fd, peek, unix.MSG_PEEK|unix.MSG_DONTWAIT); err != nil || n < whole {
		return nil, recordForRecv, nil // still arriving: Recv waits for the rest
	}
	f := &wire.Frame{}
	rest := bytes.NewReader(peek[lengthBytes:])
	s.dec.Reset(rest)
	if err := f.DecodeMsgpack(s.dec); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", transport.ErrMalformed, err)
	}
	if rest.Len() != 0 {
		if recycle := f.TakeRecycle(); recycle != nil {
			recycle()
		}
		return nil, 0, fmt.Errorf("%w: a frame ends before its record", transport.ErrMalformed)
	}
	if transport.Bulk(f) { // a big message's header: its reassembly is Recv's
		if recycle := f.TakeRecycle(); recycle != nil {
			recycle()
		}
		return nil, recordForRecv, nil
	}
	// The frame holds none of peek's memory (wire decodes into memory of its own).
	if err := s.consume(peek); err != nil {
		if recycle := f.TakeRecycle(); recycle != nil {
			recycle()
		}
		return nil, 0, err
	}
	return f, 0, nil
}

// isChunk reports whether a record starting with b holds a chunk or an abort (the frame's
// kind is its second field, after the array header: see wire's encodeHead).
func isChunk(b []byte) bool {
	if len(b) < 3 || b[1] != 0xcc { // a uint8 (msgpack 0xcc) after a fixarray header
		return false
	}
	k := wire.FrameKind(b[2])
	return k == wire.FrameChunk || k == wire.FrameAbort
}

// consume reads again the bytes a peek found into buf, taking them from the socket.
func (s selfReadingStream) consume(buf []byte) error {
	got, err := unix.Read(s.raw.fd, buf)
	if err != nil {
		return readError(err)
	}
	if got != len(buf) {
		return fmt.Errorf("read %d of the %d bytes a peek found", got, len(buf))
	}
	s.received.Add(1)
	return nil
}

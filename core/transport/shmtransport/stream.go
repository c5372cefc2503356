package shmtransport

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/tensorplay/tensorplay-rpc/core/futex"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"
)

// stream is one stream over a shared region. The Unix socket it was set up on stays open for
// its life: wake-up bytes travel on it (so a sleeping reader waits in Go's network poller and
// holds no thread), and its end is how each side learns the other is gone, dead or alive.
type stream struct {
	conn *net.UnixConn
	mem  []byte
	out  ringWriter
	in   ringReader
	// peer names the other end for errors.
	peer string
	// hostAddrPrefix starts the addresses of this host's shared-memory listeners.
	hostAddrPrefix string

	parts wire.Parts
	dec   *msgpack.Decoder
	sink  wire.ChunkSink

	gone atomic.Pointer[error] // why the stream ended, once it has
	done chan struct{}         // closed by Close

	mu       sync.Mutex
	users    int // Send and Recv calls under way: the region stays mapped until they end
	closed   bool
	unmapped bool
	onClose  func()
}

var (
	_ transport.SinkSetter       = (*stream)(nil)
	_ transport.IdentifiedStream = (*stream)(nil)
)

// Identity implements transport.IdentifiedStream: an accepted stream comes from this host.
func (s *stream) Identity() transport.PeerIdentity {
	return transport.PeerIdentity{HostAddrPrefix: s.hostAddrPrefix}
}

// newStream runs over mem, writing ring out and reading ring 1-out.
func newStream(conn *net.UnixConn, mem []byte, ringBytes, out int, peer string) *stream {
	s := &stream{conn: conn, mem: mem, peer: peer, dec: msgpack.NewDecoder(nil), done: make(chan struct{})}
	s.out = ringWriter{r: ringAt(mem, out, ringBytes), wake: s.wakePeer, broken: s.broken}
	// The reader checks only whether the stream ended: it learns of the peer's death from its
	// own read of the socket, so it needs no poll of it on every wait.
	s.in = ringReader{r: ringAt(mem, 1-out, ringBytes), sleep: s.sleep, broken: s.goneErr}
	return s
}

func (s *stream) SetChunkSink(sink wire.ChunkSink) { s.sink = sink }

// Send writes f into the outgoing ring.
func (s *stream) Send(f *wire.Frame) error {
	if !s.enter() {
		return s.ended()
	}
	defer s.leave()
	pieces, total, err := s.parts.Encode(f)
	if err != nil {
		return err
	}
	if total > wire.MaxFrameBytes {
		return fmt.Errorf("frame of %d bytes is over the limit of %d", total, wire.MaxFrameBytes)
	}
	if err := s.out.write(pieces, total); err != nil {
		return s.fail(err)
	}
	return nil
}

// Recv reads the next frame from the incoming ring.
func (s *stream) Recv() (*wire.Frame, error) {
	if !s.enter() {
		return nil, s.ended()
	}
	defer s.leave()
	f, err := s.in.readFrame(s.dec, s.sink)
	if err != nil {
		return nil, s.fail(fmt.Errorf("from %s: %w", s.peer, err))
	}
	return f, nil
}

// wakePeer sends the peer's sleeping reader its wake-up byte.
func (s *stream) wakePeer() error {
	_, err := s.conn.Write([]byte{1})
	if err != nil {
		return fmt.Errorf("wake %s: %w", s.peer, err)
	}
	return nil
}

// sleep waits for wake-up bytes; the socket's end means the peer is gone.
func (s *stream) sleep() error {
	var buf [64]byte
	if _, err := s.conn.Read(buf[:]); err != nil {
		return s.fail(fmt.Errorf("%s is gone: %w", s.peer, err))
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
	s.closed = true
	s.users++ // this Close uses the region to wake a waiting producer
	onClose := s.onClose
	s.mu.Unlock()
	close(s.done)
	s.conn.Close()
	s.out.r.ctrl.spaceSeq.Add(1)
	futex.WakeAll(&s.out.r.ctrl.spaceSeq)
	s.leave()
	if onClose != nil {
		onClose()
	}
	return nil
}

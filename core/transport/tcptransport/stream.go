package tcptransport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"
)

// After the hello, each side sends records: a 4-byte big-endian length, then that many bytes
// of one msgpack-encoded frame (package wire). A record of length 0 is a heartbeat (liveness.go).
const lengthBytes = 4

// maxRecord bounds one record: a frame is at most wire.MaxFrameBytes, so a peer announcing
// more is refused before anything is read or allocated.
const maxRecord = wire.MaxFrameBytes

// coalesceBytes: a frame encoded in at most this many bytes is copied into one buffer and
// written with one write; a bigger one is written with writev from the memory it references.
const coalesceBytes = 64 << 10

// stream is a transport.Stream over one TCP (or TLS) connection. Send writes from the calling
// goroutine, so a frame reaches the socket without a hand-off; Recv reads on the caller's
// goroutine, decoding a chunk straight into the memory its sink gives.
type stream struct {
	conn     net.Conn
	identity transport.PeerIdentity

	wmu      sync.Mutex // one write at a time: Send's and the heartbeat's
	parts    wire.Parts
	head     [lengthBytes]byte
	scratch  []byte
	sentBeat atomic.Bool // something was written since the heartbeat last looked

	// Reading: Recv, and a thread reading for itself (self_reading.go), each under readMu;
	// Recv waits for the socket without it. heldSmall: Recv returned a small frame its caller
	// has not handled (it has not called Recv again), so no thread may read the next.
	readMu    sync.Mutex
	heldSmall bool
	in        *bufio.Reader
	lim       limitedReader
	dec       *msgpack.Decoder
	sink      atomic.Pointer[wire.ChunkSink]
	raw       *rawSocket // nil over TLS: no thread reads for itself
	// atBoundary: Recv waits for the next record's first byte, holding nothing half read,
	// so it may let go of readMu while it waits (socketReader).
	atBoundary bool

	// The bulk lane (lanes.go): its own stream over the other connection, read by readBulk,
	// one frame per turn; nil for a bulk lane itself.
	bulk       *stream
	bulkFrames chan received
	bulkTurn   chan struct{}
	bulkOnce   sync.Once
	giveTurn   bool // Recv returned a bulk frame (or an accepted stream's hello): its turn next
	helloFirst bool // an accepted stream whose hello Recv has not returned yet

	// received counts the reads that brought bytes; reading is set while Recv waits for
	// them (liveness.go counts only the silence of a peer this side is waiting for).
	received atomic.Uint64
	reading  atomic.Bool

	closeOnce sync.Once
	closed    chan struct{}
	// why is the reason the stream was broken here (closed locally, or the peer fell silent),
	// once closed is closed: the connection's own error then says only that it was closed.
	why error

	onClose func(*stream)
}

var (
	_ transport.SinkSetter       = (*stream)(nil)
	_ transport.IdentifiedStream = (*stream)(nil)
)

func newStream(conn net.Conn, identity transport.PeerIdentity, l liveness, onClose func(*stream)) *stream {
	s := makeStream(conn, identity, onClose)
	go s.beat(l)
	go s.watch(l)
	return s
}

// makeStream is a stream over conn without its heartbeat and watcher.
func makeStream(conn net.Conn, identity transport.PeerIdentity, onClose func(*stream)) *stream {
	s := &stream{conn: conn, identity: identity, dec: msgpack.NewDecoder(nil), closed: make(chan struct{}), onClose: onClose}
	s.raw = newRawSocket(conn)
	if s.raw != nil {
		s.in = bufio.NewReaderSize(socketReader{s}, 64<<10)
	} else {
		s.in = bufio.NewReaderSize(interruptibleReader{countingReader{conn, &s.received}, s}, 64<<10)
	}
	s.lim.r = s.in
	return s
}

// asTransportStream is s as the transport hands it out: one a thread may read for itself
// where its socket allows.
func (s *stream) asTransportStream() transport.Stream {
	if s.raw != nil {
		return selfReadingStream{s}
	}
	return s
}

// Identity implements transport.IdentifiedStream.
func (s *stream) Identity() transport.PeerIdentity { return s.identity }

// SetChunkSink implements transport.SinkSetter: chunks are the bulk lane's to decode.
func (s *stream) SetChunkSink(sink wire.ChunkSink) {
	if s.bulk != nil {
		s.bulk.SetChunkSink(sink)
		return
	}
	s.sink.Store(&sink)
}

// Send writes f as one record, on the bulk lane if it belongs there.
func (s *stream) Send(f *wire.Frame) error {
	if s.bulk != nil && transport.Bulk(f) {
		return s.bulk.Send(f)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	pieces, total, err := s.parts.Encode(f)
	if err != nil {
		return fmt.Errorf("encode a frame: %w", err)
	}
	if total > maxRecord {
		return fmt.Errorf("a frame of %d bytes is more than the %d a peer takes", total, maxRecord)
	}
	binary.BigEndian.PutUint32(s.head[:], uint32(total))
	if total <= coalesceBytes {
		b := append(s.scratch[:0], s.head[:]...)
		for _, p := range pieces {
			b = append(b, p...)
		}
		s.scratch = b
		_, err = s.conn.Write(b)
	} else {
		bufs := make(net.Buffers, 0, 1+len(pieces))
		bufs = append(bufs, s.head[:])
		bufs = append(bufs, pieces...)
		_, err = bufs.WriteTo(s.conn)
	}
	s.sentBeat.Store(true)
	if err != nil {
		// A record cut short leaves the stream unreadable: it ends here.
		return s.fail(fmt.Errorf("send: %w", err))
	}
	return nil
}

// Recv reads the next frame, skipping heartbeats. Waiting for a record's first byte it lets go
// of readMu (socketReader), so a thread may read small frames for itself meanwhile.
func (s *stream) Recv() (*wire.Frame, error) {
	if s.bulk != nil {
		s.bulkOnce.Do(func() { go s.readBulk() })
		if s.giveTurn {
			s.giveTurn = false
			s.bulkTurn <- struct{}{} // the frame Recv returned last is handled
		}
	}
	s.reading.Store(true)
	defer s.reading.Store(false)
	for {
		if s.bulk != nil {
			select {
			case r := <-s.bulkFrames:
				if r.err != nil {
					return nil, s.fail(r.err)
				}
				s.giveTurn = true
				return r.f, nil
			default:
			}
		}
		s.readMu.Lock()
		s.heldSmall = false // the caller has handled what Recv returned last
		s.atBoundary = s.in.Buffered() == 0
		f, err := s.readRecord()
		s.atBoundary = false
		if f != nil && !transport.Bulk(f) {
			s.heldSmall = true
		}
		s.readMu.Unlock()
		switch {
		case errors.Is(err, errInterrupted), f == nil && err == nil: // a bulk frame; a heartbeat
			continue
		case err != nil:
			return nil, err
		case s.bulk != nil && transport.Bulk(f):
			return nil, s.fail(fmt.Errorf("%w: a big message's frame (kind %d) on the small lane", transport.ErrMalformed, f.Kind))
		}
		if s.helloFirst {
			s.helloFirst, s.giveTurn = false, true
		}
		return f, nil
	}
}

// readRecord reads the next record: a frame, or nil for a heartbeat. Called with readMu held.
func (s *stream) readRecord() (*wire.Frame, error) {
	var head [lengthBytes]byte
	if _, err := io.ReadFull(s.in, head[:]); err != nil {
		if errors.Is(err, errInterrupted) {
			return nil, err
		}
		return nil, s.fail(readError(err))
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == 0 {
		return nil, nil
	}
	if n > maxRecord {
		return nil, s.fail(fmt.Errorf("%w: a record of %d bytes, more than %d", transport.ErrMalformed, n, maxRecord))
	}
	f := &wire.Frame{}
	if sink := s.sink.Load(); sink != nil {
		f.Sink = *sink
	}
	s.lim.n, s.lim.err = int64(n), nil
	s.dec.Reset(&s.lim)
	err := f.DecodeMsgpack(s.dec)
	switch {
	case s.lim.err != nil: // the connection failed under the decoder
		return nil, s.fail(readError(s.lim.err))
	case err != nil:
		return nil, s.fail(fmt.Errorf("%w: %w", transport.ErrMalformed, err))
	case s.lim.n != 0:
		if recycle := f.TakeRecycle(); recycle != nil {
			recycle()
		}
		return nil, s.fail(fmt.Errorf("%w: a frame ends %d bytes before its record", transport.ErrMalformed, s.lim.n))
	}
	return f, nil
}

// readError says what a failed read of the connection means.
func readError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the peer closed the connection inside a record: %w", err)
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("the peer closed the connection: %w", err)
	}
	return err
}

// Close ends the stream; the peer's Recv then fails.
func (s *stream) Close() error {
	s.breakWith(transport.ErrClosed)
	return nil
}

// breakWith ends the stream for why, once; later reads and writes report why.
func (s *stream) breakWith(why error) {
	s.closeOnce.Do(func() {
		s.why = why
		close(s.closed)
		if s.bulk != nil {
			s.bulk.breakWith(why)
		}
		if s.raw != nil {
			s.raw.close() // waits for threads reading the socket by its number
		}
		s.conn.Close()
		if s.onClose != nil {
			s.onClose(s)
		}
	})
}

// fail reports err for a read or write that failed: the reason the stream was broken here,
// if it was (its connection's error says only "use of closed connection"), else err, after
// ending the stream.
func (s *stream) fail(err error) error {
	select {
	case <-s.closed:
		return s.why
	default:
	}
	s.breakWith(err)
	return s.why
}

// limitedReader reads at most n bytes of a record from r, for the msgpack decoder (which
// reads through it directly: it is an io.ByteScanner). err keeps a failure of r itself, which
// is the connection's, not the peer's malformed frame.
type limitedReader struct {
	r   *bufio.Reader
	n   int64
	err error
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if err != nil {
		l.err = err
	}
	return n, err
}

func (l *limitedReader) ReadByte() (byte, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	b, err := l.r.ReadByte()
	if err != nil {
		l.err = err
		return 0, err
	}
	l.n--
	return b, nil
}

func (l *limitedReader) UnreadByte() error {
	if err := l.r.UnreadByte(); err != nil {
		return err
	}
	l.n++
	return nil
}

// socketReader reads a plain TCP connection for Recv's buffer, with readMu held. Waiting for a
// record's first byte it lets go of readMu, so a thread may read for itself meanwhile, and takes
// it again when the socket has bytes: while a thread reads, that wait is on readMu, not on the
// socket, so the frames the thread takes do not wake Recv's goroutine. Each read is one system
// call; a wait is Go's poller.
type socketReader struct{ s *stream }

func (r socketReader) Read(p []byte) (int, error) {
	s := r.s
	var n int
	var readErr error
	released := false
	err := s.raw.rc.Read(func(fd uintptr) bool {
		if released {
			s.readMu.Lock()
			released = false
		}
		n, readErr = unix.Read(int(fd), p)
		if readErr == unix.EAGAIN {
			if s.atBoundary {
				released = true
				s.readMu.Unlock()
			}
			return false
		}
		return readErr != unix.EINTR
	})
	if released { // the wait failed (the connection closed, or readBulk's deadline)
		s.readMu.Lock()
	}
	switch {
	case s.interrupted(err):
		if s.atBoundary {
			return 0, errInterrupted
		}
		return r.Read(p) // inside a record: it is read whole first
	case err != nil:
		return 0, err
	case readErr != nil:
		return 0, readErr
	case n == 0:
		return 0, io.EOF
	}
	s.received.Add(1)
	s.atBoundary = false
	return n, nil
}

// countingReader counts the reads of r that brought bytes.
type countingReader struct {
	r io.Reader
	n *atomic.Uint64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n.Add(1)
	}
	return n, err
}

// interruptibleReader is countingReader for a TLS stream's small lane: a read readBulk's
// deadline cuts short ends at a record's boundary, and is tried again inside one.
type interruptibleReader struct {
	countingReader
	s *stream
}

func (r interruptibleReader) Read(p []byte) (int, error) {
	for {
		n, err := r.countingReader.Read(p)
		if n > 0 || !r.s.interrupted(err) {
			return n, err
		}
		if r.s.atBoundary {
			return 0, errInterrupted
		}
	}
}

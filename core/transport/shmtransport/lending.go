package shmtransport

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"golang.org/x/sys/unix"
)

// Lending: a big message's chunks are not copied into the ring (nor, for one too big for the
// landing area or that finds no room there, into a landing: placing.go). The producer writes a frame
// whose big byte strings it lends (their addresses in its own memory) and the consumer copies
// them straight from the producer's memory into where they go (process_vm_readv, as
// TensorPipe's CMA channel does): one copy end to end instead of two. The producer keeps the
// memory unchanged until the consumer releases the ring past the frame (stream.Settled).
//
// A consumer reads a producer only after it has proved it can: at the handshake it writes
// random bytes into the shared region and reads them back from the producer's mapping of it
// (lenderBase, in the producer's process as SO_PEERCRED names it). Without the right to read
// another process (ptrace rules, a seccomp filter, another PID namespace) the check fails and
// chunks go through the ring as before.
//
// A lending frame in the ring: its 4-byte length has lendsFlag set and counts what is in the
// ring: the number of lent spans (u32), each span (u32 position in the frame, u32 length, u64
// address), then the frame's bytes that are not lent. A consumer checks every span as it
// checks ring indices: in order, within the frame, only from a producer it agreed to read.

const (
	lendsFlag = 1 << 31
	// minLentBytes is the smallest byte string lent rather than copied into the ring.
	minLentBytes = 64 << 10
	// maxLentSpans bounds the spans of one frame (a chunk lends one).
	maxLentSpans  = 8
	lentSpanBytes = 16
	// LentChunkBytes is the chunk length a stream that lends asks for (ChunkBytes): the
	// consumer reads a lent chunk in one go however long it is, so each costs a wake-up of
	// the producer and of the consumer's helper, and long chunks cost fewer of them.
	LentChunkBytes = wire.MaxFrameBytes / 2
)

// lendingWindow bounds the bytes a producer lends that its consumer has not read: a ring's
// worth, as copying into the ring would hold, and at least two chunks, so the consumer reads
// one while the producer lends the next.
func lendingWindow(ringBytes uint64) uint64 {
	return max(ringBytes, 2*LentChunkBytes)
}

// errRevoked is why a frame read from lent memory is dropped: its producer's stream ended and
// it may have reused the memory meanwhile.
var errRevoked = errors.New("the peer closed the stream while its memory was read")

// lentFrame is a frame whose lent memory the consumer may not have read yet: lent bytes, read
// once the consumer releases the ring up to end.
type lentFrame struct {
	end uint64
	n   int
}

// lentSpan is a byte string of the current frame that the producer lends: frame bytes
// [at, at+n) are at addr in its process.
type lentSpan struct {
	at, n int
	addr  uint64
	piece int // on the producer's side, the piece lent
}

// probeOffset is where the probe bytes of the ring of lane in direction dir lie in the region.
func probeOffset(lane, dir int) uintptr {
	var c ringCtrl
	return uintptr((2*lane+dir)*ctrlBytes) + unsafe.Offsetof(c.probe)
}

// offerLending tells the consumer of the bulk ring written in direction dir where this
// process maps the region, for its check.
func offerLending(mem []byte, ringBytes, dir int) {
	ringAt(mem, laneBulk, dir, ringBytes).ctrl.lenderBase.Store(uint64(uintptr(unsafe.Pointer(&mem[0]))))
}

// lender is a producer's process that this side reads lent memory from. Once the producer
// has exited and been reaped its pid may name another process: pidfd, opened before the
// read-back check, tells after each read whether the producer had exited by then.
type lender struct {
	pid   int
	pidfd int
}

// errLenderGone is why a read of lent memory ended when the producer's process had exited.
var errLenderGone = errors.New("the peer's process is gone")

// read copies len(p) bytes at addr in the producer's memory into p.
func (l *lender) read(p []byte, addr uint64) error {
	err := readProcessShared(l.pid, p, addr)
	// Checked after every read, even one that worked: the bytes may be another process's.
	if l.exited() || errors.Is(err, unix.ESRCH) {
		return errLenderGone
	}
	return err
}

// exited reports whether the producer's process has exited.
func (l *lender) exited() bool {
	fds := []unix.PollFd{{Fd: int32(l.pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err != unix.EINTR {
			return err != nil || n > 0
		}
	}
}

// close lets go of the producer's pidfd; l may be nil.
func (l *lender) close() {
	if l != nil {
		unix.Close(l.pidfd)
	}
}

// acceptLending checks whether this process can read the producer of the bulk ring written in
// direction dir, process pid, and if so tells it to lend. It returns the process to read, or
// nil.
func acceptLending(mem []byte, ringBytes, dir, pid int) *lender {
	ctrl := ringAt(mem, laneBulk, dir, ringBytes).ctrl
	base := ctrl.lenderBase.Load()
	if pid <= 0 || base == 0 {
		return nil
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil
	}
	l := &lender{pid: pid, pidfd: pidfd}
	if _, err := rand.Read(ctrl.probe[:]); err != nil {
		l.close()
		return nil
	}
	var seen [len(ctrl.probe)]byte
	if err := l.read(seen[:], base+uint64(probeOffset(laneBulk, dir))); err != nil || !bytes.Equal(seen[:], ctrl.probe[:]) {
		l.close()
		return nil
	}
	ctrl.readsLender.Store(1)
	return l
}

// A core copies about 10 GB/s between processes here and two cores nearly twice that (one core
// does not reach the memory's bandwidth), so a long read is cut into pieces that the reading
// goroutine and a helper take in turn. The reader takes every piece the helper has not taken
// by the time it gets there: a helper slow to start (every core busy) costs a goroutine, not a
// wait. Pieces end at the 2 MiB boundaries of the peer's memory: the kernel locks the page
// table covering 2 MiB while it pins its pages, and two goroutines pinning in the same 2 MiB
// took turns (measured: with 512 KiB pieces the helper gained nothing on a torch tensor).
const (
	sharedReadPiece = 2 << 20
	sharedReadMin   = 2 * sharedReadPiece
)

// sharedRead is a read of lent memory that more than one goroutine copies.
type sharedRead struct {
	pid    int
	p      []byte
	addr   uint64
	skew   int // how far addr lies past a piece boundary
	pieces int64
	next   atomic.Int64 // the next piece to take
	done   atomic.Int64 // pieces copied (or failed)
	all    chan struct{}
	errMu  sync.Mutex
	err    error
}

// readProcessShared is readProcess, with a helper goroutine taking part in a long read.
func readProcessShared(pid int, p []byte, addr uint64) error {
	if len(p) < sharedReadMin || runtime.GOMAXPROCS(0) < 2 {
		return readProcess(pid, p, addr)
	}
	skew := int(addr % sharedReadPiece)
	s := &sharedRead{pid: pid, p: p, addr: addr, skew: skew, pieces: int64((skew + len(p) + sharedReadPiece - 1) / sharedReadPiece), all: make(chan struct{})}
	go s.take()
	s.take()
	<-s.all
	return s.err
}

// take copies pieces until none is left to take.
func (s *sharedRead) take() {
	for {
		i := int(s.next.Add(1) - 1)
		if int64(i) >= s.pieces {
			return
		}
		from := max(0, i*sharedReadPiece-s.skew)
		to := min(len(s.p), (i+1)*sharedReadPiece-s.skew)
		if err := readProcess(s.pid, s.p[from:to], s.addr+uint64(from)); err != nil {
			s.errMu.Lock()
			if s.err == nil {
				s.err = err
			}
			s.errMu.Unlock()
		}
		if s.done.Add(1) == s.pieces {
			close(s.all)
		}
	}
}

// readProcess copies len(p) bytes at addr in process pid into p.
func readProcess(pid int, p []byte, addr uint64) error {
	if len(p) == 0 {
		return nil
	}
	local := []unix.Iovec{{Base: &p[0]}}
	local[0].SetLen(len(p))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(p)}}
	n, err := unix.ProcessVMReadv(pid, local, remote, 0)
	if err == nil && n != len(p) {
		err = fmt.Errorf("read %d of %d bytes", n, len(p))
	}
	return err
}

// writeLending writes a frame of pieces, lending the big ones the frame references
// (referenced(i)) instead of copying them into the ring. A frame with none to lend, or too
// big a rest for the ring, is written as usual.
func (w *ringWriter) writeLending(pieces [][]byte, referenced func(int) bool, total int) error {
	w.spans = w.spans[:0]
	for i, p := range pieces {
		// The last piece is never lent: the consumer reads a byte of the ring after the last
		// span, so releasing the ring past the frame says it read them all.
		if referenced(i) && len(p) >= minLentBytes && i < len(pieces)-1 && len(w.spans) < maxLentSpans {
			w.spans = append(w.spans, lentSpan{n: len(p), addr: uint64(uintptr(unsafe.Pointer(&p[0]))), piece: i})
		}
	}
	inRing, ok := w.spanFrameLayout(pieces)
	if !ok {
		return w.write(pieces, total)
	}
	lent := total - (inRing - 4 - lentSpanBytes*len(w.spans))
	if err := w.awaitLendingRoom(lent); err != nil {
		return err
	}
	if err := w.writeSpans(pieces, inRing, lendsFlag); err != nil {
		return err
	}
	w.lentTo.Store(w.head)
	w.lent = append(w.lent, lentFrame{end: w.head, n: lent})
	w.lentBytes += lent
	return nil
}

// spanFrameLayout sets the frame positions of w.spans (chosen by piece, in order) and returns
// how many bytes the frame puts in the ring; ok is unset if it has no span or too big a rest
// for the ring.
func (w *ringWriter) spanFrameLayout(pieces [][]byte) (inRing int, ok bool) {
	inRing, at, next := 4, 0, 0
	for i, p := range pieces {
		if next < len(w.spans) && w.spans[next].piece == i {
			w.spans[next].at = at
			next++
		} else {
			inRing += len(p)
		}
		at += len(p)
	}
	inRing += lentSpanBytes * len(w.spans)
	return inRing, len(w.spans) > 0 && uint64(inRing) <= w.r.size-4
}

// writeSpans writes a frame of pieces whose spans (w.spans, laid out by spanFrameLayout) are
// not in the ring: its length word with flags, the span table, the other pieces.
func (w *ringWriter) writeSpans(pieces [][]byte, inRing int, flags uint32) error {
	var head [4 + 4 + lentSpanBytes*maxLentSpans]byte
	putUint32(head[:], uint32(inRing)|flags)
	putUint32(head[4:], uint32(len(w.spans)))
	table := head[8:]
	for i, sp := range w.spans {
		e := table[i*lentSpanBytes:]
		putUint32(e, uint32(sp.at))
		putUint32(e[4:], uint32(sp.n))
		putUint32(e[8:], uint32(sp.addr))
		putUint32(e[12:], uint32(sp.addr>>32))
	}
	if err := w.put(head[:8+lentSpanBytes*len(w.spans)]); err != nil {
		return err
	}
	next := 0
	for i, p := range pieces {
		if next < len(w.spans) && w.spans[next].piece == i {
			next++
			continue
		}
		if err := w.put(p); err != nil {
			return err
		}
	}
	return w.publish()
}

// awaitLendingRoom waits until the consumer has read enough of what was lent that n more bytes
// fit in the lending window. Without this bound lent frames, small in the ring, would queue a big
// message whole ahead of the next (big messages take turns, writer.go) and keep its memory
// busy longer than copying it in would.
func (w *ringWriter) awaitLendingRoom(n int) error {
	for {
		tail := w.r.ctrl.tail.Load()
		for len(w.lent) > 0 && w.lent[0].end <= tail {
			w.lentBytes -= w.lent[0].n
			w.lent = w.lent[1:]
		}
		if w.lentBytes == 0 || uint64(w.lentBytes+n) <= lendingWindow(w.r.size) {
			return nil
		}
		if err := w.awaitRelease(tail); err != nil {
			return err
		}
	}
}

// settle waits until the consumer has released the ring up to lentTo (a value lentTo had: the
// end of a frame that lent memory). It touches only the shared control block: it may run
// beside a write.
func (w *ringWriter) settle(lentTo uint64) error {
	for {
		tail := w.r.ctrl.tail.Load()
		if tail >= lentTo {
			return nil
		}
		if err := w.awaitRelease(tail); err != nil {
			return err
		}
	}
}

// beginLending starts reading a frame that lends memory, inRing of whose bytes are in the
// ring; it returns the frame's length, at most maxLen.
func (r *ringReader) beginLending(inRing, maxLen int, placed bool) (int, error) {
	if placed && r.area == nil {
		return 0, fmt.Errorf("%w: its bytes are in a landing area, which this stream does not read", transport.ErrMalformed)
	}
	if !placed && r.lender == nil {
		return 0, fmt.Errorf("%w: it lends memory, which this stream does not read", transport.ErrMalformed)
	}
	r.spansPlaced = placed
	if inRing < 4 || uint64(inRing) > r.r.size-4 {
		return 0, fmt.Errorf("%w: a lending frame with %d bytes in a ring of %d", transport.ErrMalformed, inRing, r.r.size)
	}
	if _, err := r.waitFor(uint64(inRing)); err != nil {
		return 0, err
	}
	r.left = inRing
	var word [4]byte
	if _, err := io.ReadFull(r, word[:]); err != nil {
		return 0, err
	}
	k := int(getUint32(word[:]))
	rest := inRing - 4 - k*lentSpanBytes
	if k < 1 || k > maxLentSpans || rest < 0 {
		return 0, fmt.Errorf("%w: a frame lends %d byte strings in %d bytes", transport.ErrMalformed, k, inRing)
	}
	var table [lentSpanBytes * maxLentSpans]byte
	if _, err := io.ReadFull(r, table[:k*lentSpanBytes]); err != nil {
		return 0, err
	}
	n, end := rest, 0
	for i := range k {
		e := table[i*lentSpanBytes:]
		sp := lentSpan{at: int(getUint32(e)), n: int(getUint32(e[4:])), addr: uint64(getUint32(e[8:])) | uint64(getUint32(e[12:]))<<32}
		if sp.at < end || sp.n < 1 || sp.n > maxLen {
			return 0, fmt.Errorf("%w: lent byte string %d at %d+%d overlaps or is empty", transport.ErrMalformed, i, sp.at, sp.n)
		}
		if placed && (sp.addr > uint64(len(r.area)) || uint64(sp.n) > uint64(len(r.area))-sp.addr) {
			return 0, fmt.Errorf("%w: byte string %d at %d+%d of a %d-byte landing area", transport.ErrMalformed, i, sp.addr, sp.n, len(r.area))
		}
		r.spans = append(r.spans, sp)
		end = sp.at + sp.n
		n += sp.n
	}
	if n > maxLen || end >= n {
		r.spans = r.spans[:0]
		return 0, fmt.Errorf("%w: a lending frame of %d bytes (at most %d), its last byte string ending at %d", transport.ErrMalformed, n, maxLen, end)
	}
	r.frameLen, r.left = n, n
	return n, nil
}

// inSpan reports whether the next byte of the current frame is lent.
func (r *ringReader) inSpan() bool {
	pos := r.frameLen - r.left
	for _, sp := range r.spans {
		if pos >= sp.at && pos < sp.at+sp.n {
			return true
		}
	}
	return false
}

// readLent reads into p from the span the current frame's next byte is in (lent true), or
// returns how many of its next bytes are in the ring before the next span (lent false).
func (r *ringReader) readLent(p []byte) (n int, lent bool, err error) {
	pos := r.frameLen - r.left
	for _, sp := range r.spans {
		if pos < sp.at {
			return sp.at - pos, false, nil
		}
		if pos >= sp.at+sp.n {
			continue
		}
		n = min(len(p), sp.at+sp.n-pos)
		if n == 0 {
			return 0, true, nil
		}
		if r.spansPlaced {
			// Nothing to copy when the bytes are read into where they already are: the
			// message's landing.
			if src := r.area[sp.addr+uint64(pos-sp.at):][:n]; &src[0] != &p[0] {
				copy(p[:n], src)
			}
			r.left -= n
			return n, true, nil
		}
		if err := r.lender.read(p[:n], sp.addr+uint64(pos-sp.at)); err != nil {
			// A lender that died cut the frame short: that is why the read ended (waitErr),
			// not a malformed frame. (One that took its loan back is found by readFrame.)
			if errors.Is(err, errLenderGone) {
				r.waitErr = err
				return 0, true, err
			}
			return 0, true, fmt.Errorf("%w: the memory it lends at %#x+%d cannot be read: %w", transport.ErrMalformed, sp.addr, sp.n, err)
		}
		r.left -= n
		return n, true, nil
	}
	return r.left, false, nil
}

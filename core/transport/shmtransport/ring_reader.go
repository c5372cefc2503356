package shmtransport

import (
	"errors"
	"fmt"
	"io"

	"github.com/tensorplay/tensorplay-rpc/core/futex"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// How a consumer sleeps (ringCtrl.readerAsleep): on the socket, woken by a byte (the stream's
// reader goroutine, in Go's network poller), or in a futex on the doorbell (a thread reading
// for itself: the peer wakes it directly, with no goroutine to wake it in turn).
const (
	readerOnSocket   = 1
	readerOnDoorbell = 2
)

// ringReader is the consumer of one ring. It reads one frame at a time (begin, then Read and
// ReadByte up to the frame's length) and implements io.Reader and io.ByteScanner for the
// msgpack decoder. Its methods are not safe for concurrent use.
type ringReader struct {
	r        ring
	tail     uint64 // bytes read
	released uint64 // the tail the producer can see
	head     uint64 // the last head seen
	// left is what remains of the current frame.
	left int
	// unread says the last read was ReadByte, which UnreadByte may undo.
	unread bool
	// sleep waits for a wake-up byte on the socket.
	sleep func() error
	// broken is non-nil once the stream cannot go on; checked on every pass of a wait, so a
	// peer that keeps moving the write index cannot keep the reader spinning past Close.
	broken func() error
	// last is the byte ReadByte returned; replay says UnreadByte gave it back. It is kept
	// here, not read again from the ring, which the peer may have changed meanwhile.
	last   byte
	replay bool
	// waitErr is why waiting for more of the current frame failed, if it did.
	waitErr error
	// whole says the current frame was found whole in the ring (a thread reading for itself,
	// which must not wait): needing more of it, or lent memory, is the peer's fault.
	whole bool
	// lender is the producer's process if this reader reads what it lends (nil: it does not,
	// and a frame that lends memory is malformed); spans is what the current frame lends and
	// frameLen its length.
	lender   *lender
	spans    []lentSpan
	frameLen int
	// area is the producer's landing area if this reader takes messages written there (nil:
	// it does not); spansPlaced says the current frame's spans are offsets in it, landing is
	// the landing the current frame (a big message's header) announces, and land hands a
	// landing over (placing.go).
	area        []byte
	mapped      uint64 // how much of area, from its start, this process has mapped
	givenBack   uint32 // ringCtrl.landingsGivenBack when mapped was last right
	spansPlaced bool
	landing     landingTrailer
	land        func(slot int) (release func())
}

// ready reports, without waiting, whether a whole frame can be read (for a frame bigger than the
// ring, its length: the rest streams through). It records the write index it saw.
func (r *ringReader) ready() (bool, error) {
	n, known, err := r.peek()
	if !known || err != nil {
		return false, err
	}
	return n > r.r.size-lengthBytes || r.head-r.tail >= lengthBytes+n, nil
}

// peek returns, without waiting, the length of the next frame if enough is written to know it.
// It records the write index it saw.
func (r *ringReader) peek() (n uint64, known bool, err error) {
	head := r.r.ctrl.head.Load()
	if head-r.tail > r.r.size {
		return 0, false, fmt.Errorf("%w: peer wrote to %d with %d bytes read", errCorrupt, head, r.tail)
	}
	r.head = head
	var prefix [lengthBytes]byte
	if head-r.tail < lengthBytes {
		return 0, false, nil
	}
	at := r.tail & (r.r.size - 1)
	k := copy(prefix[:], r.r.data[at:])
	copy(prefix[k:], r.r.data)
	return uint64(getUint32(prefix[:]) &^ (lendsFlag | placesFlag)), true, nil
}

// lengthBytes is the size of a frame's length prefix.
const lengthBytes = 4

// changed reports whether the producer wrote more since ready looked.
func (r *ringReader) changed() bool { return r.r.ctrl.head.Load() != r.head }

// available waits for data and returns how much there is.
func (r *ringReader) available() (uint64, error) {
	return r.waitFor(1)
}

// waitFor waits until at least n bytes (at most the ring's size) are readable and returns
// how many there are.
func (r *ringReader) waitFor(n uint64) (uint64, error) {
	ctrl := r.r.ctrl
	for r.head-r.tail < n {
		if r.whole {
			return 0, fmt.Errorf("%w: a frame outgrew what was written of it", transport.ErrMalformed)
		}
		if r.broken != nil {
			if err := r.broken(); err != nil {
				return 0, err
			}
		}
		head := ctrl.head.Load()
		if head-r.tail > r.r.size {
			return 0, fmt.Errorf("%w: peer wrote to %d with %d bytes read", errCorrupt, head, r.tail)
		}
		if head-r.tail >= n {
			r.head = head
			break
		}
		// Not enough: give back all room before sleeping, so a producer waiting for it can go on.
		r.release()
		ctrl.readerAsleep.Store(readerOnSocket)
		if ctrl.head.Load() != head {
			continue // the producer will send a byte nobody waits for: a harmless extra wake-up
		}
		if err := r.sleep(); err != nil {
			return 0, err
		}
	}
	return r.head - r.tail, nil
}

// release tells the producer that the bytes read so far may be overwritten.
func (r *ringReader) release() {
	if r.released == r.tail {
		return
	}
	ctrl := r.r.ctrl
	ctrl.tail.Store(r.tail)
	r.released = r.tail
	if ctrl.writerAsleep.Load() != 0 && ctrl.writerAsleep.CompareAndSwap(1, 0) {
		ctrl.spaceSeq.Add(1)
		futex.WakeAll(&ctrl.spaceSeq)
	}
}

// readFrame reads and decodes the next frame, with chunk bytes going where sink says.
func (r *ringReader) readFrame(dec *msgpack.Decoder, sink wire.ChunkSink) (*wire.Frame, error) {
	if _, err := r.begin(wire.MaxFrameBytes); err != nil {
		return nil, err
	}
	f := &wire.Frame{Sink: sink}
	dec.Reset(r)
	r.waitErr = nil
	err := f.DecodeMsgpack(dec)
	// The producer may have reused lent memory while it was read, or freed it so that the read
	// failed: it revokes before it does. The load comes after the reads (a syscall each) and
	// pairs with the producer's store, both sequentially consistent atomics on coherent shared
	// memory: a read that overlapped the reuse finds the flag set.
	if len(r.spans) > 0 && !r.spansPlaced && r.r.ctrl.revoked.Load() != 0 {
		return nil, errRevoked
	}
	if err != nil {
		if r.waitErr != nil {
			// A frame bigger than the ring, or one that lends memory, is decoded as it comes:
			// it was cut short (the peer is gone, the stream closed), not malformed.
			return nil, r.waitErr
		}
		return nil, fmt.Errorf("%w: %w", transport.ErrMalformed, err)
	}
	if err := r.end(); err != nil {
		return nil, fmt.Errorf("%w: %w", transport.ErrMalformed, err)
	}
	if r.landing.n > 0 {
		if err := r.attachLanding(f); err != nil {
			return nil, fmt.Errorf("%w: %w", transport.ErrMalformed, err)
		}
	}
	return f, nil
}

// begin starts reading the next frame and returns its length, at most maxLen.
func (r *ringReader) begin(maxLen int) (int, error) {
	var prefix [4]byte
	r.spans = r.spans[:0]
	r.left = len(prefix)
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return 0, err
	}
	word := getUint32(prefix[:])
	r.landing = landingTrailer{}
	if word&(lendsFlag|placesFlag) != 0 && r.whole {
		return 0, fmt.Errorf("%w: a frame lends memory or lands a message in the small lane", transport.ErrMalformed)
	}
	if word&lendsFlag != 0 {
		return r.beginLending(int(word&^(lendsFlag|placesFlag)), maxLen, word&placesFlag != 0)
	}
	n := int(word)
	if word&placesFlag != 0 {
		var err error
		if n, err = r.beginLanding(int(word &^ placesFlag)); err != nil {
			return 0, err
		}
	}
	if n > maxLen {
		return 0, fmt.Errorf("%w: it announces a %d-byte frame, more than %d", transport.ErrMalformed, n, maxLen)
	}
	// A frame that fits the ring is decoded only once all of it is there: a chunk's bytes go
	// to memory reserved from the receive budget, and a peer that stopped halfway must not
	// hold that memory in a decode that never ends (it is evicted while waiting here).
	if uint64(n) <= r.r.size-uint64(len(prefix)) {
		if _, err := r.waitFor(uint64(n)); err != nil {
			return 0, err
		}
	}
	r.left = n
	return n, nil
}

// end finishes a frame, which the decoder must have read to its last byte.
func (r *ringReader) end() error {
	if r.left != 0 {
		return fmt.Errorf("frame has %d bytes after its encoding", r.left)
	}
	r.unread = false
	// A frame that lent memory is released at once: its producer may be waiting to reuse it.
	if r.tail-r.released >= min(publishStep, r.r.size/4) || len(r.spans) > 0 {
		r.spans = r.spans[:0]
		r.release()
	}
	return nil
}

// Read reads from the current frame.
func (r *ringReader) Read(p []byte) (int, error) {
	r.unread = false
	if r.left == 0 {
		return 0, io.EOF
	}
	if r.replay && len(p) > 0 {
		r.replay = false
		p[0] = r.last
		r.tail++
		r.left--
		return 1, nil
	}
	inRing := r.left
	if len(r.spans) > 0 {
		n, lent, err := r.readLent(p)
		if lent || err != nil {
			return n, err
		}
		inRing = n
	}
	avail, err := r.available()
	if err != nil {
		r.waitErr = err
		return 0, err
	}
	n := min(uint64(len(p)), avail, uint64(inRing))
	at := r.tail & (r.r.size - 1)
	k := uint64(copy(p[:n], r.r.data[at:]))
	copy(p[k:n], r.r.data)
	r.tail += n
	r.left -= int(n)
	if r.tail-r.released >= min(publishStep, r.r.size/4) {
		r.release()
	}
	return int(n), nil
}

// ReadByte reads one byte of the current frame.
func (r *ringReader) ReadByte() (byte, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	if r.replay {
		r.replay = false
	} else {
		if r.inSpan() {
			return 0, fmt.Errorf("%w: a lent byte string where the frame's encoding is", transport.ErrMalformed)
		}
		if _, err := r.available(); err != nil {
			r.waitErr = err
			return 0, err
		}
		r.last = r.r.data[r.tail&(r.r.size-1)]
	}
	r.tail++
	r.left--
	r.unread = true
	return r.last, nil
}

// UnreadByte undoes the last ReadByte. The byte is still in the ring: reading releases room
// only after a Read, never after a ReadByte.
func (r *ringReader) UnreadByte() error {
	if !r.unread {
		return errors.New("UnreadByte without a ReadByte before it")
	}
	r.unread = false
	r.replay = true
	r.tail--
	r.left++
	return nil
}

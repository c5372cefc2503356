package shmtransport

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core/futex"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// ringCtrl is the control block of one direction of a stream, in shared memory. Each field
// sits on its own cache line so the two processes do not contend for one.
type ringCtrl struct {
	// head counts the bytes ever written; only the producer stores it.
	head atomic.Uint64
	_    [56]byte
	// tail counts the bytes ever read; only the consumer stores it.
	tail atomic.Uint64
	_    [56]byte
	// readerAsleep is set by a consumer about to sleep, to how it sleeps (readerOnSocket or
	// readerOnDoorbell): the producer that clears it owes it that wake-up.
	readerAsleep atomic.Uint32
	_            [60]byte
	// doorbell, in the small lane's block of a direction, is the futex word a thread that
	// reads the stream for itself sleeps on; the producer of either lane rings it.
	doorbell atomic.Uint32
	_        [60]byte
	// writerAsleep is set by a producer waiting for space; the consumer that clears it bumps
	// spaceSeq, the futex word the producer sleeps on.
	writerAsleep atomic.Uint32
	spaceSeq     atomic.Uint32
	_            [56]byte
	// lenderBase is where the producer's process maps the region, and probe bytes the
	// consumer wrote to find there; the consumer sets readsLender once it has (lending.go),
	// and the producer may then lend it big byte strings instead of copying them in.
	lenderBase  atomic.Uint64
	readsLender atomic.Uint32
	// revoked is set by the producer before it reuses memory the consumer may not have read
	// yet (its stream is ending); the consumer checks it after reading lent memory.
	revoked atomic.Uint32
	probe   [16]byte
	// readsLandings is set by the consumer of a bulk ring that takes big messages written
	// into the landing area of its direction; landings[k] is 1 while landing k is the
	// consumer's (set by the producer, cleared by the consumer when nothing reads it any
	// more; placing.go).
	readsLandings atomic.Uint32
	landings      [maxLandings]atomic.Uint32
	_             [64]byte
	// heartbeat, in the small lane's block of a direction, is bumped by that direction's
	// producer process every beat while it runs (liveness.go).
	heartbeat atomic.Uint64
	// landingsGivenBack, in the bulk lane's block, counts the times the producer gave the
	// pages of its landing area back (idle.go): the consumer maps them afresh.
	landingsGivenBack atomic.Uint32
}

// ring is one direction of a stream: its control block and data area in a mapped region.
// Every index read from the control block was written by the peer and is checked before use.
type ring struct {
	ctrl *ringCtrl
	data []byte
	size uint64 // len(data), a power of two
}

// ringAt is the ring of lane written in direction dir (0 or 1) of a region mapped for rings
// of ringBytes.
func ringAt(mem []byte, lane, dir, ringBytes int) ring {
	i := 2*lane + dir
	at := 4 * ctrlBytes
	for j := range i {
		at += laneBytes(j/2, ringBytes)
	}
	n := laneBytes(lane, ringBytes)
	return ring{ctrl: (*ringCtrl)(unsafe.Pointer(&mem[i*ctrlBytes])), data: mem[at : at+n], size: uint64(n)}
}

// publishStep is how many bytes of a big frame are written (or read) before the other side is
// told: it can copy out one part while the next is copied in.
const publishStep = 512 << 10

// spaceWaitSlice bounds one futex sleep of a producer: a consumer that never wakes it (hostile,
// or dead before it could) is rechecked this often.
const spaceWaitSlice = 50 * time.Millisecond

var errCorrupt = fmt.Errorf("%w: shared-memory ring indices are inconsistent", transport.ErrMalformed)

// ringWriter is the producer of one ring. Its methods are not safe for concurrent use.
type ringWriter struct {
	r         ring
	head      uint64 // bytes written, published or not
	published uint64 // the head the consumer can see
	// lentTo is the head after the last frame that lent memory: the consumer has read all it
	// lent once it releases the ring up to here.
	lentTo atomic.Uint64
	spans  []lentSpan
	// lent is the frames whose lent memory the consumer may still be reading, lentBytes theirs.
	lent      []lentFrame
	lentBytes int
	// wake tells the consumer, asleep as readerAsleep said, that there is data.
	wake func(how uint32) error
	// broken is non-nil once the stream cannot go on (closed, or the peer gone).
	broken func() error
}

// write puts one frame: its length, then its pieces, and publishes it.
func (w *ringWriter) write(pieces [][]byte, total int) error {
	var prefix [4]byte
	putUint32(prefix[:], uint32(total))
	if err := w.put(prefix[:]); err != nil {
		return err
	}
	for _, p := range pieces {
		if err := w.put(p); err != nil {
			return err
		}
	}
	return w.publish()
}

func (w *ringWriter) put(b []byte) error {
	for len(b) > 0 {
		free, err := w.space()
		if err != nil {
			return err
		}
		n := min(uint64(len(b)), free)
		at := w.head & (w.r.size - 1)
		k := uint64(copy(w.r.data[at:], b[:n]))
		copy(w.r.data, b[k:n])
		w.head += n
		b = b[n:]
		if w.head-w.published >= min(publishStep, w.r.size/4) {
			if err := w.publish(); err != nil {
				return err
			}
		}
	}
	return nil
}

// space waits until the ring has room and returns how much.
func (w *ringWriter) space() (uint64, error) {
	ctrl := w.r.ctrl
	for {
		tail := ctrl.tail.Load()
		used := w.head - tail
		if used > w.r.size || tail > w.published {
			return 0, fmt.Errorf("%w: peer read to %d of %d bytes written", errCorrupt, tail, w.published)
		}
		if used < w.r.size {
			return w.r.size - used, nil
		}
		// Full: let the consumer see everything, then sleep until it makes room.
		if err := w.publish(); err != nil {
			return 0, err
		}
		if err := w.awaitRelease(tail); err != nil {
			return 0, err
		}
	}
}

// awaitRelease sleeps until the consumer releases bytes past tail, or for a wait slice, and
// reports whether the stream can go on.
func (w *ringWriter) awaitRelease(tail uint64) error {
	ctrl := w.r.ctrl
	seq := ctrl.spaceSeq.Load()
	ctrl.writerAsleep.Store(1)
	if ctrl.tail.Load() == tail {
		futex.Sleep(&ctrl.spaceSeq, seq, spaceWaitSlice)
	}
	return w.broken()
}

// publish makes the bytes written visible and wakes a sleeping consumer.
func (w *ringWriter) publish() error {
	if w.head == w.published {
		return nil
	}
	ctrl := w.r.ctrl
	ctrl.head.Store(w.head)
	w.published = w.head
	if how := ctrl.readerAsleep.Load(); how != 0 && ctrl.readerAsleep.CompareAndSwap(how, 0) {
		return w.wake(how)
	}
	return nil
}

func putUint32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
func getUint32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func putUint64(b []byte, v uint64) {
	putUint32(b, uint32(v))
	putUint32(b[4:], uint32(v>>32))
}
func getUint64(b []byte) uint64 {
	return uint64(getUint32(b)) | uint64(getUint32(b[4:]))<<32
}

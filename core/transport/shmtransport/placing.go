package shmtransport

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"golang.org/x/sys/unix"
)

// Placing: a big message that fits in the landing area of its direction is written there by
// its producer, chunk by chunk as the core's writer sends them, and the consumer's core
// reassembles it in place (wire.Frame.SetLanding) and lends it to Python as it is. The one
// copy end to end is then the producer's memcpy into shared memory (25-35 GB/s for 16 MiB
// here) instead of the consumer's process_vm_readv (9-18 GB/s), and the producer's memory is
// free as soon as Send returns.
//
// The header of such a message is a frame whose length word has placesFlag set, then a
// trailer: the landing's slot (u32), offset in the area (u64) and length (u64), which must be
// the message's size. Each chunk is a frame whose spans (as lent spans, lending.go) are
// offsets in the area; a consumer reading a chunk into its landing finds the bytes already
// there. Everything the producer announces is bounds-checked against the area. As with any
// peer, what it sends is its own choice: it could change a landing's bytes while the consumer
// reads them, which the consumer's own copy of a network message would not show.
//
// The consumer gives a landing back by clearing its slot (ringCtrl.landings) once nothing
// reads its memory (for Python, when the last view of the message dies). Until then the
// producer does not reuse it; when the area has no room, a message travels as before (lent,
// or through the ring). The consumer keeps the region mapped while it holds a landing, even
// after the stream ends, so the memory lent to Python stays valid.
//
// Fresh pages are the cost to manage. The first write to a page of shared memory faults, at
// 6-10 us a page on these VMs (40 ms for 16 MiB, 80 times the copy); populating them in one
// system call (MADV_POPULATE_WRITE) costs about half. So the producer populates the area from
// its start as far as landings need (warm), and reuses those pages: the first message of a
// size on a stream pays for its pages once, as a fresh receive buffer would, and later ones
// pay nothing. The consumer maps each stretch it first reads in one call too. An asynchronous
// warm-up, tried first, made the calls meanwhile slower: populating holds the process's memory
// map, which every allocation that maps memory waits for.
const (
	// LandingAreaBytes is the landing area of each direction of a stream. It is address
	// space: a page takes memory once a message is written to it, and keeps it for reuse
	// until the stream ends.
	LandingAreaBytes = 64 << 20
	// maxLandings bounds the landings a consumer holds per direction.
	maxLandings = 64
	// landingAlign aligns landings to pages: arrays lent in place keep their alignment.
	landingAlign = 4096
	// placesFlag, in a frame's length word: a header with a landing trailer, or with
	// lendsFlag, a frame whose spans are in the landing area.
	placesFlag          = 1 << 30
	landingTrailerBytes = 4 + 8 + 8
)

// maxWarmLandingBytes bounds the landing memory a process populates across its streams: with
// many peers on a host, every stream keeping 64 MiB of landings would add up. (A variable for
// tests.)
var maxWarmLandingBytes int64 = 256 << 20

// warmLandingBytes is the landing memory this process has populated, in streams not yet
// unmapped.
var warmLandingBytes atomic.Int64

// landingTrailer is the landing a header announces: bytes [off, off+n) of the area, slot k.
type landingTrailer struct {
	slot   int
	off, n uint64
}

// placer is the producer's side of a landing area: the landings the consumer holds, and the
// messages whose chunks are being written into theirs. Used under the bulk lane's sendMu.
type placer struct {
	area []byte
	ctrl *ringCtrl
	held []landingTrailer          // by offset
	open map[uint64]landingTrailer // by message ID, until its last chunk is written
	// waitedInVain says the last wait for a landing to come back saw none come back: the
	// consumer keeps what it got, and later messages do not wait until one does.
	waitedInVain bool

	// warm is how much of the area, from its start, is populated (populate): landings are
	// taken there first, and the area grows only when the consumer holds all of it.
	warm atomic.Uint64
}

func newPlacer(area []byte, ctrl *ringCtrl) *placer {
	return &placer{area: area, ctrl: ctrl, open: map[uint64]landingTrailer{}}
}

// begin finds a landing for the big message whose header f is, if the consumer takes
// landings and the area has room.
func (p *placer) begin(f *wire.Frame) (landingTrailer, bool) {
	if p.ctrl.readsLandings.Load() != 1 {
		return landingTrailer{}, false
	}
	var n uint64
	for _, size := range f.Sizes {
		if size < 0 || uint64(size) > math.MaxInt64-n {
			return landingTrailer{}, false
		}
		n += uint64(size)
	}
	if n == 0 || n > uint64(len(p.area)) {
		return landingTrailer{}, false
	}
	l, ok := p.alloc(n)
	if ok {
		p.open[f.ID] = l
	}
	return l, ok
}

// alloc takes the first gap of n bytes in the area, and a free slot. In a round trip that
// sends a landed message back (an echo) the consumer may still hold the previous call's landing
// for a moment: before it grows the area (populating pages costs 25 ms per 16 MiB here, once)
// it waits up to landingWait for one to come back.
func (p *placer) alloc(n uint64) (landingTrailer, bool) {
	var l landingTrailer
	var i int
	found := p.gap(n, &l, &i)
	if !found && !p.waitedInVain && len(p.held) > len(p.open) {
		// (A landing still being written comes back only after this goroutine writes it.)
		for start := time.Now(); !found && time.Since(start) < landingWait; {
			_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			found = p.gap(n, &l, &i)
		}
		p.waitedInVain = !found
	}
	if !found {
		end := l.off + n
		if l.slot < 0 || end > uint64(len(p.area)) || !p.grow(alignUp(end)) {
			return landingTrailer{}, false
		}
	}
	p.held = slices.Insert(p.held, i, l)
	p.ctrl.landings[l.slot].Store(1)
	return l, true
}

// landingWait bounds how long alloc waits for the consumer to give a landing back.
const landingWait = 300 * time.Microsecond

// gap finds, after reclaiming what the consumer gave back, the first gap of n bytes and a free
// slot: *l (slot -1 if none) at index *i of held. It reports whether both were found in the
// populated part of the area; if not, l.off is where the gap would start.
func (p *placer) gap(n uint64, l *landingTrailer, i *int) bool {
	p.reclaim()
	var taken [maxLandings]bool
	for _, h := range p.held {
		taken[h.slot] = true
	}
	at, k := uint64(0), 0
	for ; k < len(p.held); k++ {
		if p.held[k].off >= at+n {
			break
		}
		at = alignUp(p.held[k].off + p.held[k].n)
	}
	*l, *i = landingTrailer{slot: slices.Index(taken[:], false), off: at, n: n}, k
	return l.slot >= 0 && at+n <= p.warm.Load()
}

// reclaim forgets the landings the consumer gave back, but those still being written (a
// consumer that dropped a message early may give its landing back before its last chunk).
func (p *placer) reclaim() {
	var writing [maxLandings]bool
	for _, l := range p.open {
		writing[l.slot] = true
	}
	before := len(p.held)
	p.held = slices.DeleteFunc(p.held, func(l landingTrailer) bool {
		return !writing[l.slot] && p.ctrl.landings[l.slot].Load() == 0
	})
	if len(p.held) < before {
		p.waitedInVain = false
	}
}

func alignUp(n uint64) uint64 { return (n + landingAlign - 1) &^ (landingAlign - 1) }

// grow populates the area up to to, unless the process has populated all the landing memory
// it may. No landing lies past warm, so nothing there is in use.
func (p *placer) grow(to uint64) bool {
	from := p.warm.Load()
	if to <= from {
		return true
	}
	if warmLandingBytes.Add(int64(to-from)) > maxWarmLandingBytes {
		warmLandingBytes.Add(-int64(to - from))
		return false
	}
	// In pieces: the call holds the process's memory map (read-locked) throughout, and
	// anything in the process that maps memory meanwhile waits for it.
	for at := from; at < to; at += populatePiece {
		populate(p.area[at:min(to, at+populatePiece)], true)
	}
	p.warm.Store(to)
	return true
}

// populatePiece is how much of the area grow populates per system call (3-4 ms here).
const populatePiece = 2 << 20

// unmapped hands back the landing memory this side populated: the region is unmapped.
func (p *placer) unmapped() { warmLandingBytes.Add(-int64(p.warm.Load())) }

// populate maps the pages of mem into this process, for writing or for reading, in one
// system call where the kernel has it (5.14): a fault per page costs several times more.
func populate(mem []byte, write bool) {
	advice := unix.MADV_POPULATE_READ
	if write {
		advice = unix.MADV_POPULATE_WRITE
	}
	if len(mem) == 0 || unix.Madvise(mem, advice) == nil {
		return
	}
	// Kernels before 5.14: a fault per page.
	var sum byte
	for i := 0; i < len(mem); i += landingAlign {
		if write {
			mem[i] = 0
		} else {
			sum += mem[i]
		}
	}
	populateSink.Store(uint32(sum))
}

// populateSink keeps the reads of populate's fallback from being optimized away.
var populateSink atomic.Uint32

// place writes chunk f into its message's landing and returns where in the area its payload
// now is; ok is unset if f's message has none.
func (p *placer) place(f *wire.Frame) (at uint64, ok bool) {
	l, ok := p.open[f.ID]
	if !ok || len(f.Payload) == 0 {
		return 0, false
	}
	off, n := uint64(f.Offset), uint64(len(f.Payload))
	if f.Offset < 0 || off > l.n || n > l.n-off {
		delete(p.open, f.ID) // not a chunk of this message: the core's writer sends none
		return 0, false
	}
	at = l.off + off
	copyShared(p.area[at:at+n], f.Payload)
	if off+n == l.n {
		delete(p.open, f.ID)
	}
	return at, true
}

// forget stops writing message id, which was aborted; the consumer gives its landing back.
func (p *placer) forget(id uint64) { delete(p.open, id) }

// writeLandingHeader writes a big message's header announcing landing l.
func (w *ringWriter) writeLandingHeader(pieces [][]byte, total int, l landingTrailer) error {
	var head [4 + landingTrailerBytes]byte
	putUint32(head[:], uint32(landingTrailerBytes+total)|placesFlag)
	putUint32(head[4:], uint32(l.slot))
	putUint64(head[8:], l.off)
	putUint64(head[16:], l.n)
	if err := w.put(head[:]); err != nil {
		return err
	}
	for _, p := range pieces {
		if err := w.put(p); err != nil {
			return err
		}
	}
	return w.publish()
}

// writePlacedChunk writes a chunk frame whose payload (one of pieces, referenced by the frame)
// is at in the landing area.
func (w *ringWriter) writePlacedChunk(pieces [][]byte, payload []byte, at uint64, total int) error {
	i := slices.IndexFunc(pieces, func(p []byte) bool { return len(p) == len(payload) && &p[0] == &payload[0] })
	if i < 0 || i == len(pieces)-1 { // (a frame's last piece is never a span: lending.go)
		return w.write(pieces, total) // the bytes go through the ring as well: still right
	}
	w.spans = append(w.spans[:0], lentSpan{n: len(payload), addr: at, piece: i})
	inRing, ok := w.spanFrameLayout(pieces)
	if !ok {
		return w.write(pieces, total)
	}
	return w.writeSpans(pieces, inRing, lendsFlag|placesFlag)
}

// beginLanding reads the trailer of a header that announces a landing, inRing bytes in the
// ring, and returns the frame's own length.
func (r *ringReader) beginLanding(inRing int) (int, error) {
	if r.area == nil {
		return 0, fmt.Errorf("%w: it announces a landing, which this stream does not take", transport.ErrMalformed)
	}
	if inRing < landingTrailerBytes {
		return 0, fmt.Errorf("%w: a landing header of %d bytes", transport.ErrMalformed, inRing)
	}
	r.left = landingTrailerBytes
	var t [landingTrailerBytes]byte
	if _, err := io.ReadFull(r, t[:]); err != nil {
		return 0, err
	}
	l := landingTrailer{slot: int(getUint32(t[:])), off: getUint64(t[4:]), n: getUint64(t[12:])}
	if l.slot >= maxLandings || l.n == 0 || l.off > uint64(len(r.area)) || l.n > uint64(len(r.area))-l.off {
		return 0, fmt.Errorf("%w: landing %d at %d+%d of a %d-byte area", transport.ErrMalformed, l.slot, l.off, l.n, len(r.area))
	}
	r.landing = l
	return inRing - landingTrailerBytes, nil
}

// attachLanding gives header f the landing it announced, which must hold its message exactly.
func (r *ringReader) attachLanding(f *wire.Frame) error {
	l := r.landing
	r.landing = landingTrailer{}
	var total uint64
	for _, n := range f.Sizes {
		if n < 0 || uint64(n) > l.n-total {
			return fmt.Errorf("a landing of %d bytes for a bigger message", l.n)
		}
		total += uint64(n)
	}
	if total != l.n || len(f.Sizes) == 0 {
		return fmt.Errorf("a landing of %d bytes for a message of %d", l.n, total)
	}
	if g := r.r.ctrl.landingsGivenBack.Load(); g != r.givenBack {
		r.givenBack, r.mapped = g, 0 // the pages this process had mapped are gone
	}
	if end := min(alignUp(l.off+l.n), uint64(len(r.area))); end > r.mapped {
		// This process reads pages of the area it never read before: mapped in one go, not a
		// fault at a time as the message is read.
		populate(r.area[r.mapped:end], false)
		r.mapped = end
	}
	f.SetLanding(r.area[l.off:l.off+l.n:l.off+l.n], r.land(l.slot))
	return nil
}

// landingHold keeps the region mapped while the consumer holds landing slot of ctrl's area
// and returns its release: the slot goes back to the producer, once, and the region may be
// unmapped. Called from Recv, which uses the region.
func (s *stream) landingHold(ctrl *ringCtrl, slot int) func() {
	s.mu.Lock()
	s.users++
	s.mu.Unlock()
	var released atomic.Bool
	return func() {
		if released.Swap(true) {
			return
		}
		ctrl.landings[slot].Store(0)
		s.leave()
	}
}

// sharedCopyMin is the shortest copy into a landing that a helper goroutine shares: two cores
// copied 16 MiB into shared memory at 34-35 GB/s here, one at 26-31.
const sharedCopyMin = 2 << 20

// copyShared copies src into dst (as long), with a helper goroutine taking half of a long copy.
func copyShared(dst, src []byte) {
	if len(src) < sharedCopyMin || runtime.GOMAXPROCS(0) < 2 {
		copy(dst, src)
		return
	}
	half := len(src) / 2 &^ (landingAlign - 1)
	done := make(chan struct{})
	go func() {
		copy(dst[half:], src[half:])
		close(done)
	}()
	copy(dst[:half], src[:half])
	<-done
}

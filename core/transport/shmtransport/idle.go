package shmtransport

import (
	"golang.org/x/sys/unix"
)

// Idle streams give their pages back. A region is sparse, but every page a ring or a landing
// ever took stays in the memfd until the stream ends: up to ~10 MiB of rings and the warm
// landings per stream once traffic has wrapped them, which a full mesh of many workers on one
// host multiplies by the square of their number. So each producer, once a lane of its direction
// has sent nothing for a while, gives back to the kernel (MADV_REMOVE, a hole punched in the
// memfd for both processes) the pages of its ring that hold nothing unread, and on the bulk
// lane its warm landings past the last one the consumer still holds. Only the producer writes
// those pages, under its lane's sendMu, which giving back holds too; the consumer reads only
// the unread part of a ring and the landings it holds. The next message after an idle spell
// pays for fresh pages once (a few milliseconds for megabytes), as the first one did.

// idleTicksBeforeGivingBack is how many ticks of tend (at most a second each) a lane must
// have sent nothing before its pages go back.
const idleTicksBeforeGivingBack = 3

// laneIdleness is what tend knows of one lane's sending; only tend uses it.
type laneIdleness struct {
	head      uint64 // the producer's write index last seen: every frame moves it
	quiet     int    // ticks since it changed
	givenBack bool   // the pages went back since the last send
}

// giveBackIfIdle gives back the free pages of each lane of s that has been idle long enough.
func (s *stream) giveBackIfIdle() {
	if !s.enter() {
		return
	}
	defer s.leave()
	for i := range s.lanes {
		l := &s.lanes[i]
		idle := &l.idle
		if head := l.out.r.ctrl.head.Load(); head != idle.head {
			*idle = laneIdleness{head: head}
			continue
		}
		if idle.givenBack {
			continue
		}
		if idle.quiet++; idle.quiet < idleTicksBeforeGivingBack {
			continue
		}
		if !l.sendMu.TryLock() { // a send under way: not idle after all
			continue
		}
		l.out.giveBackFree()
		if i == laneBulk {
			s.placer.giveBackIdle()
		}
		l.sendMu.Unlock()
		idle.givenBack = true
	}
}

// giveBackFree gives back the pages of the ring's data area that hold no unread byte; under
// the lane's sendMu, between frames.
func (w *ringWriter) giveBackFree() {
	size := w.r.size
	tail := w.r.ctrl.tail.Load() // the consumer may read on meanwhile: the free part only grows
	if w.head-tail >= size {
		return
	}
	// The free bytes run from head to tail+size, round the ring; whole pages of them go.
	from, to := pageUp(w.head), pageDown(tail+size)
	for from < to {
		at := from % size
		n := min(to-from, size-at)
		unix.Madvise(w.r.data[at:at+n], unix.MADV_REMOVE)
		from += n
	}
}

// giveBackIdle gives back the warm landing pages past the last landing the consumer holds;
// under the bulk lane's sendMu.
func (p *placer) giveBackIdle() {
	p.reclaim()
	if len(p.open) > 0 {
		return
	}
	keep := uint64(0)
	for _, l := range p.held {
		keep = max(keep, alignUp(l.off+l.n))
	}
	warm := p.warm.Load()
	if warm <= keep {
		return
	}
	unix.Madvise(p.area[keep:warm], unix.MADV_REMOVE)
	warmLandingBytes.Add(-int64(warm - keep))
	p.warm.Store(keep)
	p.ctrl.landingsGivenBack.Add(1)
}

func pageUp(n uint64) uint64   { return (n + pageBytes - 1) &^ (pageBytes - 1) }
func pageDown(n uint64) uint64 { return n &^ (pageBytes - 1) }

const pageBytes = 4096

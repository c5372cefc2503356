package tcptransport

import (
	"errors"
	"fmt"
	"time"
)

// A peer process that is frozen (stopped, in a debugger, swapping) keeps its kernel
// acknowledging what is sent to it, so TCP itself never notices; and a peer cut off without a
// word is noticed by TCP only while there is data to send. So each side writes a heartbeat
// (an empty record) every beat in which it wrote nothing else, and a stream whose peer has
// sent nothing for the peer timeout while this side waited to read ends, naming the silence.
//
// Silence is counted in the watcher's own ticks, not in wall-clock time: a whole job stopped
// with Ctrl-Z and resumed ticks no more while stopped, and keeps its streams. And it counts
// only while Recv waits: a receiver that stopped reading (its consumer holds it back) has the
// peer's heartbeats queued behind data, which is no fault of the peer's.

// liveness is how a stream judges its peer.
type liveness struct {
	beat        time.Duration // how often each side writes, at least
	silentTicks int           // beats of silence after which the peer is taken for lost
}

func livenessFor(peerTimeout time.Duration) liveness {
	beat := min(max(peerTimeout/6, 20*time.Millisecond), 5*time.Second)
	return liveness{beat: beat, silentTicks: max(2, int((peerTimeout+beat-1)/beat))}
}

// ErrPeerSilent is wrapped by what a stream reports once its peer fell silent.
var ErrPeerSilent = errors.New("the peer sent nothing (not even a heartbeat) for the peer timeout")

var heartbeat [lengthBytes]byte

// beat writes a heartbeat each beat in which nothing else was written, until the stream ends.
// A heartbeat waiting for room in a full send buffer waits like any write.
func (s *stream) beat(l liveness) {
	t := time.NewTicker(l.beat)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return
		case <-t.C:
		}
		if s.sentBeat.Swap(false) {
			continue
		}
		s.wmu.Lock()
		_, err := s.conn.Write(heartbeat[:])
		s.wmu.Unlock()
		if err != nil {
			s.fail(fmt.Errorf("send a heartbeat: %w", err))
			return
		}
	}
}

// watch ends the stream once its peer has sent nothing for l.silentTicks ticks during which
// Recv waited.
func (s *stream) watch(l liveness) {
	t := time.NewTicker(l.beat)
	defer t.Stop()
	last, silent := s.received.Load(), 0
	for {
		select {
		case <-s.closed:
			return
		case <-t.C:
		}
		got := s.received.Load()
		switch {
		case got != last:
			last, silent = got, 0
		case s.reading.Load():
			silent++
		default:
			silent = 0
		}
		if silent >= l.silentTicks {
			s.fail(fmt.Errorf("%w (%s)", ErrPeerSilent, time.Duration(silent)*l.beat))
			return
		}
	}
}

package shmtransport

import (
	"fmt"
	"time"
)

// Liveness. A process that is frozen (SIGSTOP, a cgroup freezer, a debugger, a thread in D
// state holding the rest) keeps its socket open, so the socket's end cannot tell the other
// side; over gRPC, keepalive pings notice it. Here each process bumps a heartbeat in the region
// of each of its streams every beat, and a stream whose peer's heartbeat stands still for the
// peer timeout ends, failing the calls, settle waits and ring-space waits on it and naming the
// peer. PeerTimeout then means the same on both transports.

// defaultPeerTimeout is the peer timeout of a transport that was given none (core's default).
const defaultPeerTimeout = 30 * time.Second

// beatsPerTimeout is how many beats a peer timeout spans (at most one beat a second): a beat
// delayed by load or a collection is far from taken for a frozen peer.
const beatsPerTimeout = 8

// peerSilence is what tend knows of one stream's peer; only tend uses it.
type peerSilence struct {
	beat     uint64        // the peer's heartbeat last seen
	silent   time.Duration // how long it has stood still, in this process's running time
	lastTick time.Time
}

// SetPeerTimeout sets how long a stream whose peer's heartbeat stands still lives (see
// core.Config.PeerTimeout); call it before Listen and Dial. 0 keeps the default.
func (t *Transport) SetPeerTimeout(d time.Duration) {
	if d <= 0 {
		d = defaultPeerTimeout
	}
	t.peerTimeout = d
}

// beatEvery is how often tend beats, looks at its peers' heartbeats and at idle lanes.
func (t *Transport) beatEvery() time.Duration {
	return min(time.Second, t.peerTimeout/beatsPerTimeout)
}

// tend beats for every stream of the transport, ends those whose peer stopped beating, and
// has idle ones give their pages back (idle.go), until the transport has no stream left (track
// starts it again for the next).
func (t *Transport) tend() {
	tick := time.NewTicker(t.beatEvery())
	defer tick.Stop()
	var streams []*stream
	for now := range tick.C {
		t.mu.Lock()
		if t.closed || len(t.streams) == 0 {
			t.watching = false
			t.mu.Unlock()
			return
		}
		streams = streams[:0]
		for s := range t.streams {
			streams = append(streams, s)
		}
		t.mu.Unlock()
		if t.frozen.Load() {
			continue
		}
		for _, s := range streams {
			s.beatAndCheck(now, t.peerTimeout, t.beatEvery())
			s.giveBackIfIdle()
		}
	}
}

// beatAndCheck bumps this side's heartbeat and ends the stream if the peer's has stood still
// for timeout. Silence is counted in this process's own ticks, each worth at most two beats: a
// process that was frozen itself (a whole job stopped with Ctrl-Z and resumed) does not take
// its peers, frozen with it, for frozen when it runs again.
func (s *stream) beatAndCheck(now time.Time, timeout, every time.Duration) {
	if !s.enter() {
		return
	}
	s.lanes[laneSmall].out.r.ctrl.heartbeat.Add(1)
	beat := s.lanes[laneSmall].in.r.ctrl.heartbeat.Load()
	s.leave()
	p := &s.silence
	if p.lastTick.IsZero() || beat != p.beat {
		p.beat, p.silent, p.lastTick = beat, 0, now
		return
	}
	p.silent += min(now.Sub(p.lastTick), 2*every)
	p.lastTick = now
	if p.silent >= timeout {
		s.fail(fmt.Errorf("%s stopped answering: its heartbeat over shared memory stood still for %v (the peer timeout; is the process stopped or frozen?)", s.peer, timeout))
	}
}

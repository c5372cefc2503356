package tcptransport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// A stream is two connections, its lanes (transport.Laned): the frames of big messages
// (transport.Bulk) travel on one, every other frame on the other. On one TCP connection a
// small frame waits behind every byte queued ahead of it in both ends' socket buffers, and
// behind a receiver slow to take them: a small call during a 256 MiB transfer to a worker
// touching fresh memory waited 1.9 s. The dialer names the lane and the stream (the pair) in
// each connection's hello; the listener pairs them, by the dialer's host and the pair.
const (
	laneSmall byte = 1
	laneBulk  byte = 2
	// pairTimeout bounds how long one lane of a stream waits for the other.
	pairTimeout = 10 * time.Second
)

var errUnpaired = errors.New("the other lane of the stream did not come")

// errInterrupted is what Recv's read of the small lane returns, at a record's boundary, when
// the bulk lane's reader has a frame for it.
var errInterrupted = errors.New("a bulk frame is ready")

type received struct {
	f   *wire.Frame
	err error
}

// BulkLane implements transport.Laned.
func (s *stream) BulkLane() {}

// attachBulk makes bulk the bulk lane of s, the small one. An accepted stream's bulk frames
// wait until its first frame, the hello, has been handled: a big message sent right after it
// must not overtake it.
func (s *stream) attachBulk(bulk *stream, accepted bool) {
	s.bulk = bulk
	s.bulkFrames = make(chan received, 1)
	s.bulkTurn = make(chan struct{}, 1)
	s.helloFirst = accepted
	if !accepted {
		s.bulkTurn <- struct{}{}
	}
}

// readBulk reads the bulk lane, one frame per turn: a chunk is decoded into the receiver's
// memory (the sink), which is not safe to use before the frame before it is handled.
func (s *stream) readBulk() {
	for {
		select {
		case <-s.bulkTurn:
		case <-s.closed:
			return
		}
		f, err := s.bulk.Recv()
		if err == nil && !transport.Bulk(f) {
			err = fmt.Errorf("%w: a frame of kind %d on the bulk lane", transport.ErrMalformed, f.Kind)
		}
		select {
		case s.bulkFrames <- received{f, err}:
		case <-s.closed:
			return
		}
		// Wake Recv if it waits on the small lane (its read fails at once, and Recv looks
		// here), and a thread reading that lane for itself, which leaves it to Recv.
		s.conn.SetReadDeadline(time.Unix(1, 0))
		if s.raw != nil && s.raw.enter() {
			s.raw.ring()
			s.raw.leave()
		}
		if err != nil {
			return
		}
	}
}

// interrupted reports whether err is the small lane's read cut short for a bulk frame (the
// deadline readBulk sets), clearing that deadline.
func (s *stream) interrupted(err error) bool {
	if s.bulk == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	s.conn.SetReadDeadline(time.Time{})
	return true
}

// pairKey names a stream being paired: the dialer's host and the stream's pair.
type pairKey struct {
	host string
	pair [pairBytes]byte
}

// pairing is where the lanes of one accepted stream meet.
type pairing struct {
	bulk chan *stream // the bulk lane, once it came
}

// pairFor returns the pairing of key, made if new. Called with t.mu held.
func (t *Transport) pairFor(key pairKey) *pairing {
	p := t.pairs[key]
	if p == nil {
		p = &pairing{bulk: make(chan *stream, 1)}
		t.pairs[key] = p
	}
	return p
}

// forgetPair removes p, if it is still key's, and closes a bulk lane no small lane took.
func (t *Transport) forgetPair(key pairKey, p *pairing) {
	t.mu.Lock()
	if t.pairs[key] == p {
		delete(t.pairs, key)
	}
	t.mu.Unlock()
	select {
	case b := <-p.bulk:
		b.Close()
	default:
	}
}

// pair joins an accepted lane with its other: a bulk lane is left for its small one (for at
// most pairTimeout); a small lane waits for its bulk one and returns the stream, or nil.
func (t *Transport) pair(s *stream, lane byte, pair [pairBytes]byte) *stream {
	host, _, _ := net.SplitHostPort(s.identity.Addr)
	key := pairKey{host: host, pair: pair}
	t.mu.Lock()
	if t.closed || t.lis == nil {
		t.mu.Unlock()
		s.Close()
		return nil
	}
	p := t.pairFor(key)
	t.mu.Unlock()
	if lane == laneBulk {
		select {
		case p.bulk <- s:
			time.AfterFunc(pairTimeout, func() { t.forgetPair(key, p) })
		default: // a second bulk lane for the pair
			s.Close()
		}
		return nil
	}
	timer := time.NewTimer(pairTimeout)
	defer timer.Stop()
	select {
	case bulk := <-p.bulk:
		t.forgetPair(key, p)
		s.attachBulk(bulk, true)
		return s
	case <-timer.C:
		t.forgetPair(key, p)
		s.fail(errUnpaired)
	case <-s.closed:
		t.forgetPair(key, p)
	}
	return nil
}

// closePairs closes the lanes waiting to be paired.
func (t *Transport) closePairs() {
	t.mu.Lock()
	pairs := t.pairs
	t.pairs = map[pairKey]*pairing{}
	t.mu.Unlock()
	for key, p := range pairs {
		t.forgetPair(key, p)
	}
}

package grpctransport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// A stream is two gRPC streams on one connection, its lanes: the frames of big messages
// (transport.Bulk) travel on one, every other frame on the other. On one gRPC stream a small
// frame queues behind all the chunks flow control lets ahead of it (measured: a small call
// during a 256 MiB transfer took 37 to 47 ms); on its own stream it is interleaved with them.
// The dialer names the lane and the pair in each stream's metadata; a stream that names no
// lane is served alone, both lanes in one.
const (
	laneKey   = "tensorplay-lane"
	pairKey   = "tensorplay-pair"
	laneSmall = "small"
	laneBulk  = "bulk"
	// pairTimeout bounds how long one half of a stream waits for the other.
	pairTimeout = 10 * time.Second
)

// msgStream is the half of a gRPC stream a lane uses: grpc.ClientStream or grpc.ServerStream.
type msgStream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
}

// laned is a transport.Stream over two lanes. Recv takes frames from a reader goroutine per
// lane. The bulk lane's reader decodes chunks into the receiver's memory (the chunk sink), so
// it decodes a frame only once the frame before it has been handled: the sink's owner is not
// safe to use from two goroutines at once.
type laned struct {
	small, bulk     msgStream
	smallMu, bulkMu sync.Mutex // one Send per lane at a time

	sink      atomic.Pointer[wire.ChunkSink] // set after the readers start (they read the hello)
	startOnce sync.Once
	frames    chan received
	bulkTurn  chan struct{} // held by the bulk reader while it decodes
	giveTurn  bool          // Recv gives the bulk reader its turn: the frame it returned last is handled
	stop      chan struct{}
	stopOnce  sync.Once
	// readErr is why a lane's reader stopped, once readFailed is closed: gRPC's SendMsg says
	// only io.EOF when the stream ended, and the reason comes to RecvMsg.
	readErr    error
	readFailed chan struct{}
	failOnce   sync.Once
	// helloFirst: the bulk reader has no turn until the first frame is handled.
	helloFirst bool
}

type received struct {
	f    *wire.Frame
	err  error
	bulk bool
}

var _ transport.SinkSetter = (*laned)(nil)

// newLaned makes a stream of two lanes. With helloFirst (an accepted stream) the bulk lane is
// read only once the first frame, which must be the hello, has come on the small lane: a big
// message sent right after it must not overtake it.
func newLaned(small, bulk msgStream, helloFirst bool) *laned {
	s := &laned{small: small, bulk: bulk, frames: make(chan received), bulkTurn: make(chan struct{}, 1), stop: make(chan struct{}), readFailed: make(chan struct{})}
	if !helloFirst {
		s.bulkTurn <- struct{}{}
	}
	s.helloFirst = helloFirst
	return s
}

// BulkLane implements transport.Laned.
func (s *laned) BulkLane() {}

func (s *laned) SetChunkSink(sink wire.ChunkSink) { s.sink.Store(&sink) }

func (s *laned) Send(f *wire.Frame) error {
	var err error
	if transport.Bulk(f) {
		s.bulkMu.Lock()
		err = s.bulk.SendMsg(f)
		s.bulkMu.Unlock()
	} else {
		s.smallMu.Lock()
		err = s.small.SendMsg(f)
		s.smallMu.Unlock()
	}
	if errors.Is(err, io.EOF) {
		// The stream ended: its reader learns why (a keepalive that went unanswered, say).
		select {
		case <-s.readFailed:
			return s.readErr
		case <-time.After(readErrWait):
		}
	}
	return err
}

// readErrWait bounds how long a Send that found the stream ended waits for the reason.
const readErrWait = time.Second

func (s *laned) readFailedWith(err error) {
	s.failOnce.Do(func() {
		s.readErr = err
		close(s.readFailed)
	})
}

func (s *laned) Recv() (*wire.Frame, error) {
	s.startOnce.Do(func() {
		go s.read(s.small, false)
		go s.read(s.bulk, true)
	})
	if s.giveTurn {
		s.giveTurn = false
		s.bulkTurn <- struct{}{} // the last bulk frame (or the hello) is handled
	}
	select {
	case r := <-s.frames:
		s.giveTurn = r.err == nil && (r.bulk || s.helloFirst)
		s.helloFirst = false
		return r.f, r.err
	case <-s.stop:
		return nil, transport.ErrClosed
	}
}

// read reads one lane until it fails or the stream ends.
func (s *laned) read(lane msgStream, bulk bool) {
	for {
		f := &wire.Frame{}
		if bulk {
			select {
			case <-s.bulkTurn:
			case <-s.stop:
				return
			}
			if sink := s.sink.Load(); sink != nil {
				f.Sink = *sink
			}
		}
		err := recvFrame(lane, f)
		if err == nil && transport.Bulk(f) != bulk {
			// Send puts every frame on the lane transport.Bulk names: one on the other lane
			// would be decoded beside the bulk reader's writes into the same message.
			err = fmt.Errorf("%w: a frame of kind %d on the %s lane", transport.ErrMalformed, f.Kind, laneName(bulk))
		}
		if err != nil {
			f = nil
			s.readFailedWith(err)
		}
		select {
		case s.frames <- received{f: f, err: err, bulk: bulk}:
		case <-s.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// recvFrame receives the next frame of a gRPC stream into f. gRPC reports a frame the codec
// could not decode (or a message it could not decompress) as codes.Internal: the peer sent
// it, so it is reported as transport.ErrMalformed.
func recvFrame(lane msgStream, f *wire.Frame) error {
	err := lane.RecvMsg(f)
	if err != nil && status.Code(err) == codes.Internal {
		return fmt.Errorf("%w: %w", transport.ErrMalformed, err)
	}
	return err
}

// end stops the readers; the gRPC streams themselves end with their owners.
func (s *laned) end() { s.stopOnce.Do(func() { close(s.stop) }) }

// openLanes opens both lanes of a stream on cc.
func openLanes(ctx context.Context, cc *grpc.ClientConn) (small, bulk grpc.ClientStream, err error) {
	var id [16]byte
	rand.Read(id[:])
	pair := hex.EncodeToString(id[:])
	if small, err = cc.NewStream(metadata.AppendToOutgoingContext(ctx, laneKey, laneSmall, pairKey, pair), &agentStreamDesc, agentStreamPath); err != nil {
		return nil, nil, err
	}
	if bulk, err = cc.NewStream(metadata.AppendToOutgoingContext(ctx, laneKey, laneBulk, pairKey, pair), &agentStreamDesc, agentStreamPath); err != nil {
		return nil, nil, err
	}
	return small, bulk, nil
}

// pairing is the meeting point of the two halves of one incoming stream.
type pairing struct {
	bulk    chan grpc.ServerStream // the bulk half, once it has come
	claimed chan struct{}          // closed when the small half took it
	done    chan struct{}          // closed when the stream is over
}

// pairings matches the halves of incoming streams, by peer address (so one connection's) and
// pair name.
type pairings struct {
	mu sync.Mutex
	m  map[string]*pairing
}

func (p *pairings) get(key string) *pairing {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]*pairing{}
	}
	e := p.m[key]
	if e == nil {
		e = &pairing{bulk: make(chan grpc.ServerStream, 1), claimed: make(chan struct{}), done: make(chan struct{})}
		p.m[key] = e
	}
	return e
}

func (p *pairings) forget(key string, e *pairing) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m[key] == e {
		delete(p.m, key)
	}
}

var errUnpaired = errors.New("the other half of the stream did not come")

// serveHalf serves one incoming gRPC stream: alone if it names no lane, else as a half of a
// laned stream, which the small half serves once the bulk half has come.
func (t *Transport) serveHalf(ss grpc.ServerStream, serve func(transport.Stream)) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	lane, pair := first(md, laneKey), first(md, pairKey)
	if lane == "" {
		serve(&grpcServerStream{ss: ss})
		return nil
	}
	p, _ := grpcpeer.FromContext(ss.Context())
	if p == nil || pair == "" || len(pair) > 64 || (lane != laneSmall && lane != laneBulk) {
		return fmt.Errorf("a stream names lane %.16q of pair %.16q", lane, pair)
	}
	key := p.Addr.String() + "/" + pair
	e := t.pairs.get(key)
	timeout := time.NewTimer(pairTimeout)
	defer timeout.Stop()
	if lane == laneBulk {
		select {
		case e.bulk <- ss:
		default:
			return errors.New("a stream names a bulk lane twice")
		}
		select {
		case <-e.claimed:
		case <-timeout.C:
			t.pairs.forget(key, e)
			return errUnpaired
		case <-ss.Context().Done():
			t.pairs.forget(key, e)
			return ss.Context().Err()
		}
		select { // the stream lives until its small half's serve returns
		case <-e.done:
		case <-ss.Context().Done():
		}
		return nil
	}
	var bulk grpc.ServerStream
	select {
	case bulk = <-e.bulk:
	case <-timeout.C:
		t.pairs.forget(key, e)
		return errUnpaired
	case <-ss.Context().Done():
		t.pairs.forget(key, e)
		return ss.Context().Err()
	}
	close(e.claimed)
	t.pairs.forget(key, e)
	s := &lanedServerStream{laned: newLaned(ss, bulk, true), ss: ss}
	defer close(e.done)
	defer s.end()
	serve(s)
	return nil
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// lanedServerStream is an accepted laned stream; it says who opened it as its small half does.
type lanedServerStream struct {
	*laned
	ss grpc.ServerStream
}

var (
	_ transport.IdentifiedStream = (*lanedServerStream)(nil)
	_ transport.Laned            = (*lanedServerStream)(nil)
)

func (s *lanedServerStream) Identity() transport.PeerIdentity {
	return (&grpcServerStream{ss: s.ss}).Identity()
}

// Close is a no-op: a server stream ends when its serve function returns.
func (s *lanedServerStream) Close() error { return nil }

func laneName(bulk bool) string {
	if bulk {
		return "bulk"
	}
	return "small"
}

package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// InmemNetwork connects in-memory transports to each other by address, for tests. A test can
// inject faults into its traffic, as raft's in-memory transport and torch's faulty agent let
// theirs: frames lost, delayed or held (so frames of the other lane overtake them, as the real
// transports' lanes allow), and links cut ([InmemNetwork.Inject], [InmemNetwork.Partition]).
type InmemNetwork struct {
	mu        sync.Mutex
	next      int
	listeners map[string]*InmemTransport
	faults    []*Injected
	cut       map[[2]string]bool // unordered pairs of addresses, smaller first
}

// NewInmemNetwork returns an empty network.
func NewInmemNetwork() *InmemNetwork {
	return &InmemNetwork{listeners: map[string]*InmemTransport{}, cut: map[[2]string]bool{}}
}

// Transport returns a new transport attached to the network.
func (n *InmemNetwork) Transport() *InmemTransport {
	return &InmemTransport{net: n, streams: map[*inmemStream]struct{}{}}
}

// ErrUnreachable is what dials and probes across a cut link fail with: no answer, which is
// not the same as a host saying nobody listens (ErrGone).
var ErrUnreachable = errors.New("no route to host")

// route returns the listener at to, or an error if from cannot reach it.
func (n *InmemNetwork) route(from, to string) (*InmemTransport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[linkKey(from, to)] {
		return nil, fmt.Errorf("%s: %w", to, ErrUnreachable)
	}
	if n.listeners[to] == nil {
		return nil, fmt.Errorf("%s: %w", to, ErrGone)
	}
	return n.listeners[to], nil
}

// InmemTransport is a Transport whose streams are in-memory queues with two lanes.
type InmemTransport struct {
	net     *InmemNetwork
	mu      sync.Mutex
	addr    string
	serve   func(Stream)
	streams map[*inmemStream]struct{}
	closed  bool
}

// Listen registers the transport on the network under a fresh address; host is ignored.
func (t *InmemTransport) Listen(_ string, serve func(Stream)) (string, error) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	t.net.next++
	addr := fmt.Sprintf("inmem-%d", t.net.next)
	t.mu.Lock()
	t.addr, t.serve = addr, serve
	t.mu.Unlock()
	t.net.listeners[addr] = t
	return addr, nil
}

// Dial connects to the transport listening at addr.
func (t *InmemTransport) Dial(ctx context.Context, addr string) (Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	from := t.addr
	t.mu.Unlock()
	remote, err := t.net.route(from, addr)
	if err != nil {
		return nil, fmt.Errorf("dial %w", err)
	}
	local, far := newInmemPipe(t.net, from, addr)
	if !t.track(local) {
		return nil, ErrClosed
	}
	if !remote.track(far) {
		t.untrack(local)
		return nil, fmt.Errorf("dial %s: connection refused", addr)
	}
	go func() {
		remote.serve(far)
		far.Close()
		remote.untrack(far)
	}()
	return local, nil
}

// Close unregisters the transport and breaks all its streams.
func (t *InmemTransport) Close() error {
	t.net.mu.Lock()
	if t.net.listeners[t.addr] == t {
		delete(t.net.listeners, t.addr)
	}
	t.net.mu.Unlock()
	t.mu.Lock()
	t.closed = true
	streams := t.streams
	t.streams = map[*inmemStream]struct{}{}
	t.mu.Unlock()
	for s := range streams {
		s.Close()
	}
	return nil
}

// Probe implements Prober: an address nobody listens on is gone; one across a cut link gives
// no telling.
func (t *InmemTransport) Probe(ctx context.Context, addr string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	from := t.addr
	t.mu.Unlock()
	if _, err := t.net.route(from, addr); err != nil {
		return fmt.Errorf("probe %w", err)
	}
	return nil
}

func (t *InmemTransport) track(s *inmemStream) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.streams[s] = struct{}{}
	return true
}

func (t *InmemTransport) untrack(s *inmemStream) {
	t.mu.Lock()
	delete(t.streams, s)
	t.mu.Unlock()
}

// inmemLaneDepth is how many frames a lane holds before Send waits, as a socket buffer does.
const inmemLaneDepth = 64

// inmemQueued is a frame in a lane and when it may be received.
type inmemQueued struct {
	f       *wire.Frame
	readyAt time.Time
	holds   []<-chan struct{}
}

// inmemPipeEnd is one direction of a pipe: two lanes (small frames, and Bulk ones), broken
// when either end closes.
type inmemPipeEnd struct {
	net      *InmemNetwork
	from, to string

	mu      sync.Mutex
	lanes   [2][]inmemQueued
	changed chan struct{} // closed and replaced whenever a lane changes
	// firstIsSmall says the first frame sent was not Bulk: it is the first received (see
	// Laned), and received says whether it has been.
	firstIsSmall, sent, received bool

	closed chan struct{}
	once   sync.Once
}

func newInmemPipeEnd(net *InmemNetwork, from, to string) *inmemPipeEnd {
	return &inmemPipeEnd{net: net, from: from, to: to, changed: make(chan struct{}), closed: make(chan struct{})}
}

// notify wakes every waiter on p's lanes; p.mu is held.
func (p *inmemPipeEnd) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func lane(f *wire.Frame) int {
	if Bulk(f) {
		return 1
	}
	return 0
}

type inmemStream struct {
	in, out       *inmemPipeEnd
	local, remote string // the addresses of this end's transport and the other end's
	accepted      bool
}

var (
	_ Laned            = (*inmemStream)(nil)
	_ IdentifiedStream = (*inmemStream)(nil)
)

// BulkLane implements Laned.
func (s *inmemStream) BulkLane() {}

// Identity implements IdentifiedStream: on an accepted stream, the address the dialing
// transport listens on.
func (s *inmemStream) Identity() PeerIdentity {
	if !s.accepted {
		return PeerIdentity{}
	}
	return PeerIdentity{Addr: s.remote}
}

func newInmemPipe(net *InmemNetwork, dialer, listener string) (dialed, accepted *inmemStream) {
	toListener, toDialer := newInmemPipeEnd(net, dialer, listener), newInmemPipeEnd(net, listener, dialer)
	return &inmemStream{in: toDialer, out: toListener, local: dialer, remote: listener},
		&inmemStream{in: toListener, out: toDialer, local: listener, remote: dialer, accepted: true}
}

func (s *inmemStream) broken() bool {
	select {
	case <-s.in.closed:
		return true
	case <-s.out.closed:
		return true
	default:
		return false
	}
}

func (s *inmemStream) Send(f *wire.Frame) error {
	p := s.out
	drop, delay, holds, duplicate := p.net.fate(p.from, p.to, f)
	l := lane(f)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if s.broken() {
			return ErrClosed
		}
		if len(p.lanes[l]) < inmemLaneDepth {
			break
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-s.in.closed:
		case <-s.out.closed:
		}
		p.mu.Lock()
	}
	if !p.sent {
		p.sent, p.firstIsSmall = true, l == 0
	}
	if drop {
		return nil
	}
	q := inmemQueued{f: f, readyAt: time.Now().Add(delay), holds: holds}
	if n := len(p.lanes[l]); n > 0 && q.readyAt.Before(p.lanes[l][n-1].readyAt) {
		q.readyAt = p.lanes[l][n-1].readyAt // a lane keeps its order
	}
	p.lanes[l] = append(p.lanes[l], q)
	if duplicate {
		again := *f
		q.f = &again
		p.lanes[l] = append(p.lanes[l], q)
	}
	p.notify()
	return nil
}

func (s *inmemStream) Recv() (*wire.Frame, error) {
	p := s.in
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if s.broken() {
			return nil, ErrClosed
		}
		wait := p.changed
		var soonest time.Duration = -1
		var hold [2]<-chan struct{}
		for l := range p.lanes {
			if len(p.lanes[l]) == 0 || (l == 1 && p.firstIsSmall && !p.received) {
				continue
			}
			head := p.lanes[l][0]
			if held := unreleased(&head); held != nil {
				hold[l] = held
				continue
			}
			if d := time.Until(head.readyAt); d > 0 {
				if soonest < 0 || d < soonest {
					soonest = d
				}
				continue
			}
			p.lanes[l] = p.lanes[l][1:]
			p.received = true
			p.notify()
			return head.f, nil
		}
		p.mu.Unlock()
		var timer *time.Timer
		var ready <-chan time.Time
		if soonest >= 0 {
			timer = time.NewTimer(soonest)
			ready = timer.C
		}
		select {
		case <-wait:
		case <-ready:
		case <-hold[0]:
		case <-hold[1]:
		case <-s.in.closed:
		case <-s.out.closed:
		}
		if timer != nil {
			timer.Stop()
		}
		p.mu.Lock()
	}
}

// unreleased returns a hold on q that is not yet released, or nil.
func unreleased(q *inmemQueued) <-chan struct{} {
	for _, h := range q.holds {
		select {
		case <-h:
		default:
			return h
		}
	}
	return nil
}

// Close breaks both directions, as a dropped connection does.
func (s *inmemStream) Close() error {
	s.in.once.Do(func() { close(s.in.closed) })
	s.out.once.Do(func() { close(s.out.closed) })
	return nil
}

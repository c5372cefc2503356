package transport

import (
	"context"
	"fmt"
	"sync"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// InmemNetwork connects in-memory transports to each other by address, for tests.
type InmemNetwork struct {
	mu        sync.Mutex
	next      int
	listeners map[string]*InmemTransport
}

// NewInmemNetwork returns an empty network.
func NewInmemNetwork() *InmemNetwork {
	return &InmemNetwork{listeners: map[string]*InmemTransport{}}
}

// Transport returns a new transport attached to the network.
func (n *InmemNetwork) Transport() *InmemTransport {
	return &InmemTransport{net: n, streams: map[*inmemStream]struct{}{}}
}

// InmemTransport is a Transport whose streams are channels.
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
	t.net.mu.Lock()
	remote := t.net.listeners[addr]
	t.net.mu.Unlock()
	if remote == nil {
		return nil, fmt.Errorf("dial %s: connection refused", addr)
	}
	local, far := newInmemPipe()
	t.mu.Lock()
	far.from = t.addr
	t.mu.Unlock()
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

// Probe implements Prober: an address nobody listens on is gone.
func (t *InmemTransport) Probe(ctx context.Context, addr string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.net.listeners[addr] == nil {
		return fmt.Errorf("probe %s: %w", addr, ErrGone)
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

// inmemPipeEnd is one direction of a pipe: a queue closed when either end closes.
type inmemPipeEnd struct {
	ch     chan *wire.Frame
	closed chan struct{}
	once   sync.Once
}

type inmemStream struct {
	in, out *inmemPipeEnd
	from    string // on an accepted stream, the address the dialing transport listens on
}

// Identity implements IdentifiedStream.
func (s *inmemStream) Identity() PeerIdentity { return PeerIdentity{Addr: s.from} }

func newInmemPipe() (*inmemStream, *inmemStream) {
	a := &inmemPipeEnd{ch: make(chan *wire.Frame, 64), closed: make(chan struct{})}
	b := &inmemPipeEnd{ch: make(chan *wire.Frame, 64), closed: make(chan struct{})}
	return &inmemStream{in: a, out: b}, &inmemStream{in: b, out: a}
}

func (s *inmemStream) Send(f *wire.Frame) error {
	select {
	case <-s.out.closed:
		return ErrClosed
	case <-s.in.closed:
		return ErrClosed
	default:
	}
	select {
	case s.out.ch <- f:
		return nil
	case <-s.out.closed:
		return ErrClosed
	case <-s.in.closed:
		return ErrClosed
	}
}

func (s *inmemStream) Recv() (*wire.Frame, error) {
	select {
	case f := <-s.in.ch:
		return f, nil
	case <-s.in.closed:
		return nil, ErrClosed
	case <-s.out.closed:
		return nil, ErrClosed
	}
}

// Close breaks both directions, as a dropped connection does.
func (s *inmemStream) Close() error {
	s.in.once.Do(func() { close(s.in.closed) })
	s.out.once.Do(func() { close(s.out.closed) })
	return nil
}

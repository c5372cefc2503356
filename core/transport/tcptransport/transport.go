// Package tcptransport carries a world's frames (package wire) over plain TCP connections, as
// TensorPipe's uv transport does: the path between hosts. Compared with gRPC (package
// grpctransport) a frame goes from the sending goroutine straight to the socket and from the
// socket straight to the reading one, with no HTTP/2 framing, flow-control windows or writer
// and reader goroutines between: fewer thread hand-offs per call, and a big message is written
// from the memory it lives in.
//
// Every connection is guarded as gRPC's are: the world's token is checked before anything
// else is read (handshake.go), mutual TLS under the world's CA when it has TLS files, a
// stranger's connection is dropped if it has not shown the token within the handshake
// timeout, and at most maxHandshakes connections may be showing it at once. A peer that falls
// silent is noticed within the peer timeout (liveness.go).
package tcptransport

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/internal/secure"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/internal/tcpconn"
)

// maxHandshakes bounds the connections a server holds that have not yet shown the token:
// beyond it, the one waiting longest is closed. An honest peer shows the token within
// milliseconds of connecting, so strangers that flood the port cannot make the server hold
// more, nor keep an honest peer out unless they connect faster than it finishes.
const maxHandshakes = 64

// Transport is the transport.Transport over plain TCP.
type Transport struct {
	sec     secure.World
	localIP net.IP
	// handshakeTimeout bounds how long an accepted connection may take to show the token.
	handshakeTimeout time.Duration

	mu       sync.Mutex
	lis      net.Listener
	accepted map[*stream]struct{}
	dialed   map[*stream]struct{}
	pending  map[net.Conn]time.Time // accepted connections in their handshake, and since when
	pairs    map[pairKey]*pairing   // accepted lanes waiting for their other (lanes.go)
	closed   bool
}

// New returns a transport that is not yet listening. A non-empty token is presented on every
// connection it opens and required on every connection it accepts; with tlsFiles, every
// connection is mutual TLS under the world's CA.
func New(token string, tlsFiles *secure.TLSFiles) (*Transport, error) {
	sec, err := secure.New(token, tlsFiles)
	if err != nil {
		return nil, err
	}
	return &Transport{
		sec:              sec,
		handshakeTimeout: sec.HandshakeTimeout(),
		accepted:         map[*stream]struct{}{},
		dialed:           map[*stream]struct{}{},
		pending:          map[net.Conn]time.Time{},
		pairs:            map[pairKey]*pairing{},
	}, nil
}

// SetPeerTimeout bounds how long a stream whose peer stopped answering lives (see
// core.Config.PeerTimeout); call it before Listen and Dial. 0 keeps the default.
func (t *Transport) SetPeerTimeout(d time.Duration) {
	t.sec = t.sec.WithPeerTimeout(d)
}

// Listen accepts streams on host at a port the OS picks.
func (t *Transport) Listen(host string, serve func(transport.Stream)) (string, error) {
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("listen on %s: %w", host, err)
	}
	t.sec.WarnIfOpen("worker", host, "make this worker unpickle, and so run, anything")
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		lis.Close()
		return "", transport.ErrClosed
	}
	t.lis = lis
	t.localIP = tcpconn.ListenIP(host)
	t.mu.Unlock()
	go t.accept(lis, serve)
	return lis.Addr().String(), nil
}

func (t *Transport) accept(lis net.Listener, serve func(transport.Stream)) {
	for {
		c, err := lis.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // out of descriptors, say: try again
			continue
		}
		go t.serveConn(c, serve)
	}
}

// serveConn checks who opened c and serves its stream.
func (t *Transport) serveConn(c net.Conn, serve func(transport.Stream)) {
	if !t.holdPending(c) {
		c.Close()
		return
	}
	s, lane, pair, err := t.acceptHandshake(c)
	t.releasePending(c)
	if err != nil {
		c.Close()
		return
	}
	if s = t.pair(s, lane, pair); s == nil {
		return // a bulk lane, left for its small one; or a small lane whose other never came
	}
	if !t.track(s, true) {
		return
	}
	defer s.Close()
	serve(s.asTransportStream())
}

// acceptHandshake completes TLS, if the world has it, checks the token, and reads which lane of
// which stream the connection is.
func (t *Transport) acceptHandshake(c net.Conn) (s *stream, lane byte, pair [pairBytes]byte, err error) {
	tcpconn.SetUserTimeout(c, t.sec.PeerTimeout())
	c.SetDeadline(time.Now().Add(t.handshakeTimeout))
	from := c.RemoteAddr().String()
	id := transport.PeerIdentity{Addr: from}
	if conf := t.sec.ServerTLS(); conf != nil {
		tc := tls.Server(c, conf)
		if err := tc.Handshake(); err != nil {
			return nil, 0, pair, err
		}
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			if cn := certs[0].Subject.CommonName; cn != "" {
				id.Names = append(id.Names, cn)
			}
			id.Names = append(id.Names, certs[0].DNSNames...)
		}
		c = tc
	}
	token, err := readToken(c)
	if err != nil {
		return nil, 0, pair, err
	}
	if !t.sec.CheckToken(token, from) {
		c.Write([]byte{answerRefused})
		return nil, 0, pair, ErrRefused
	}
	if lane, pair, err = readLane(c); err != nil {
		return nil, 0, pair, err
	}
	if _, err := c.Write([]byte{answerAccepted}); err != nil {
		return nil, 0, pair, err
	}
	c.SetDeadline(time.Time{})
	onClose := t.forget
	if lane == laneBulk {
		onClose = nil // the stream is its small lane's
	}
	return newStream(c, id, livenessFor(t.sec.PeerTimeout()), onClose), lane, pair, nil
}

// Dial opens a stream to addr: its small lane's connection, then its bulk lane's.
func (t *Transport) Dial(ctx context.Context, addr string) (transport.Stream, error) {
	var pair [pairBytes]byte
	rand.Read(pair[:])
	small, err := t.dialLane(ctx, addr, laneSmall, pair, t.forget)
	if err != nil {
		return nil, err
	}
	bulk, err := t.dialLane(ctx, addr, laneBulk, pair, nil)
	if err != nil {
		small.Close()
		return nil, err
	}
	small.attachBulk(bulk, false)
	if !t.track(small, false) {
		return nil, transport.ErrClosed
	}
	return small.asTransportStream(), nil
}

func (t *Transport) dialLane(ctx context.Context, addr string, lane byte, pair [pairBytes]byte, onClose func(*stream)) (*stream, error) {
	t.mu.Lock()
	localIP := t.localIP
	t.mu.Unlock()
	c, err := tcpconn.Dial(ctx, addr, localIP)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	s, err := t.dialHandshake(ctx, c, lane, pair, onClose)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("open stream to %s: %w", addr, err)
	}
	return s, nil
}

func (t *Transport) dialHandshake(ctx context.Context, c net.Conn, lane byte, pair [pairBytes]byte, onClose func(*stream)) (*stream, error) {
	tcpconn.SetUserTimeout(c, t.sec.PeerTimeout())
	deadline := time.Now().Add(t.handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if conf := t.sec.ClientTLS(); conf != nil {
		tc := tls.Client(c, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		c = tc
	}
	if err := writeHello(c, t.sec.Token(), lane, pair); err != nil {
		return nil, err
	}
	if err := readAnswer(c); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if !stop() {
		return nil, ctx.Err()
	}
	c.SetDeadline(time.Time{})
	return newStream(c, transport.PeerIdentity{}, livenessFor(t.sec.PeerTimeout()), onClose), nil
}

// Probe implements transport.Prober.
func (t *Transport) Probe(ctx context.Context, addr string) error {
	t.mu.Lock()
	localIP := t.localIP
	t.mu.Unlock()
	return tcpconn.Probe(ctx, addr, localIP)
}

// holdPending records c as in its handshake, closing the connection in its handshake longest
// if there are maxHandshakes.
func (t *Transport) holdPending(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.lis == nil {
		return false
	}
	if len(t.pending) >= maxHandshakes {
		var oldest net.Conn
		var since time.Time
		for p, at := range t.pending {
			if oldest == nil || at.Before(since) {
				oldest, since = p, at
			}
		}
		delete(t.pending, oldest)
		oldest.Close()
	}
	t.pending[c] = time.Now()
	return true
}

func (t *Transport) releasePending(c net.Conn) {
	t.mu.Lock()
	delete(t.pending, c)
	t.mu.Unlock()
}

// track records s, or closes it if the transport is closed (or, for an accepted stream, no
// longer listening).
func (t *Transport) track(s *stream, accepted bool) bool {
	t.mu.Lock()
	ok := !t.closed && (!accepted || t.lis != nil)
	switch {
	case ok && accepted:
		t.accepted[s] = struct{}{}
	case ok:
		t.dialed[s] = struct{}{}
	}
	t.mu.Unlock()
	if !ok {
		s.Close()
	}
	return ok
}

func (t *Transport) forget(s *stream) {
	t.mu.Lock()
	delete(t.accepted, s)
	delete(t.dialed, s)
	t.mu.Unlock()
}

// StopListening stops accepting streams and ends the accepted ones at once; dialed streams go
// on until Close.
func (t *Transport) StopListening() {
	t.mu.Lock()
	lis := t.lis
	t.lis = nil
	accepted := t.accepted
	t.accepted = map[*stream]struct{}{}
	pending := t.pending
	t.pending = map[net.Conn]time.Time{}
	t.mu.Unlock()
	if lis != nil {
		lis.Close()
	}
	for c := range pending {
		c.Close()
	}
	t.closePairs()
	for s := range accepted {
		s.Close()
	}
}

// Close stops listening and breaks every stream. The listener goes first: a peer that sees
// this worker's streams end and probes it must find it gone.
func (t *Transport) Close() error {
	t.StopListening()
	t.mu.Lock()
	t.closed = true
	dialed := t.dialed
	t.dialed = map[*stream]struct{}{}
	t.mu.Unlock()
	for s := range dialed {
		s.Close()
	}
	return nil
}

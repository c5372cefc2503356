// Package shmtransport carries streams between agents on one host through shared memory, as
// TensorPipe's shm transport does: a dialer connects to the listener's abstract Unix socket,
// shows the world's token, and passes a sealed memfd region holding two lanes of rings per direction
// (SCM_RIGHTS). Frames are written into the rings once and read out once (a big chunk, where
// the peer may read this process, is read once straight from its memory instead: lending.go); a
// reader with nothing to read sleeps on the socket and is woken by one byte, so an idle stream
// costs no CPU, and the socket's end tells each side at once that the other is gone.
//
// Two agents can use it only if they share a boot and a network namespace ([HostKey]); the
// address it listens on says which host it is on, and [Transport.Reaches] says whether an
// address is reachable from here. Everything the peer writes into the region is untrusted:
// ring indices and frame lengths are checked before use, and the region must be sealed
// against resizing before it is mapped.
package shmtransport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/internal/secure"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"golang.org/x/sys/unix"
)

// DefaultRingBytes is the data area of each direction of a stream: big frames stream through
// it, so it bounds memory per stream, not message size.
const DefaultRingBytes = 4 << 20

// addrPrefix starts every address of this transport: shm://<host key>/<socket name>.
const addrPrefix = "shm://"

// Transport is the shared-memory transport.Transport.
type Transport struct {
	sec       secure.World
	hostKey   string
	ringBytes int
	// noLending keeps this side from reading what peers lend, and noLandings from taking
	// messages written into landings (tests of the other paths).
	noLending, noLandings bool

	mu       sync.Mutex
	listener *net.UnixListener
	streams  map[*stream]struct{}
	closed   bool

	admission admission
	// preAuth is how long a dialer has to show its hello (preAuthTimeout; tests set it).
	preAuth time.Duration

	// peerTimeout ends a stream whose peer's heartbeat stood still that long (liveness.go);
	// watching says tend runs (under mu). frozen stops this side's beats: tests freeze
	// a peer with it, as SIGSTOP would.
	peerTimeout time.Duration
	watching    bool
	frozen      atomic.Bool
}

// New returns a transport that is not yet listening. A non-empty token is shown on every
// stream it opens and required on every stream it accepts; streams are also accepted only from
// processes of this process's user. ringBytes 0 means DefaultRingBytes.
func New(token string, ringBytes int) (*Transport, error) {
	if ringBytes == 0 {
		ringBytes = DefaultRingBytes
	}
	if !validRingBytes(ringBytes) {
		return nil, fmt.Errorf("shared-memory ring of %d bytes: want a power of two in [%d, %d]", ringBytes, MinRingBytes, MaxRingBytes)
	}
	key, err := HostKey()
	if err != nil {
		return nil, err
	}
	sec, err := secure.New(token, nil)
	if err != nil {
		return nil, err
	}
	return &Transport{sec: sec, hostKey: key, ringBytes: ringBytes, streams: map[*stream]struct{}{}, preAuth: preAuthTimeout, peerTimeout: defaultPeerTimeout}, nil
}

// Listen accepts streams on a fresh abstract Unix socket; host is ignored (the socket is
// reachable from this host and network namespace only).
func (t *Transport) Listen(_ string, serve func(transport.Stream)) (string, error) {
	var nonce [12]byte
	rand.Read(nonce[:])
	name := fmt.Sprintf("tensorplay-rpc/%d/%s", os.Getpid(), hex.EncodeToString(nonce[:]))
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		return "", fmt.Errorf("listen on abstract socket %s: %w", name, err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		lis.Close()
		return "", transport.ErrClosed
	}
	t.listener = lis
	t.mu.Unlock()
	go t.accept(lis, serve)
	return addrPrefix + t.hostKey + "/" + name, nil
}

// setUp runs the listener's side of a new stream's handshake (one of the set-ups accept
// admitted), then serves it.
func (t *Transport) setUp(conn *net.UnixConn, serve func(transport.Stream)) {
	// A dialer has preAuthTimeout to show its hello, and the whole set-up handshakeTimeout.
	start := time.Now()
	conn.SetDeadline(start.Add(t.preAuth))
	authed := func() { conn.SetDeadline(start.Add(handshakeTimeout)) }
	mem, ringBytes, lender, err := acceptHandshake(conn, t.sec.CheckToken, !t.noLending, authed)
	t.admission.inFlight.Add(-1)
	if err != nil {
		slog.Debug("tensorplay-rpc: shared-memory stream not set up", "err", err)
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	s := newStream(conn, mem, ringBytes, 1, lender, !t.noLandings, "the worker at "+peerName(conn))
	s.hostAddrPrefix = addrPrefix + t.hostKey + "/"
	s.helloFirst = true
	if !t.track(s) {
		return
	}
	serve(s)
	s.Close()
}

// Reaches reports whether addr is a shared-memory address on this host and namespace.
func (t *Transport) Reaches(addr string) bool {
	key, _, ok := splitAddr(addr)
	return ok && key == t.hostKey
}

func splitAddr(addr string) (hostKey, name string, ok bool) {
	rest, ok := strings.CutPrefix(addr, addrPrefix)
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, "/")
}

// Dial opens a stream to the agent listening at addr, on this host.
func (t *Transport) Dial(ctx context.Context, addr string) (transport.Stream, error) {
	key, name, ok := splitAddr(addr)
	if !ok {
		return nil, fmt.Errorf("%q is not a shared-memory address", addr)
	}
	if key != t.hostKey {
		return nil, fmt.Errorf("%s is on another host or network namespace", addr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "@"+name)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	conn := c.(*net.UnixConn)
	deadline := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) }) // a cancelled ctx ends the set-up
	mem, lender, err := dialHandshake(conn, t.sec.Token(), t.ringBytes, !t.noLending)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		if mem != nil { // set up, then the context ended
			unix.Munmap(mem)
			lender.close()
		}
		return nil, fmt.Errorf("set up shared memory with %s: %w", addr, err)
	}
	conn.SetDeadline(time.Time{})
	s := newStream(conn, mem, t.ringBytes, 0, lender, !t.noLandings, "the worker at "+addr)
	if !t.track(s) {
		return nil, transport.ErrClosed
	}
	return s, nil
}

// Probe implements transport.Prober: on this host, an abstract socket that refuses a
// connection has no listener, so its worker's process is gone; one whose listener is not the
// worker's process (another user's, or another pid's) is gone too.
func (t *Transport) Probe(ctx context.Context, addr string) error {
	key, name, ok := splitAddr(addr)
	if !ok || key != t.hostKey {
		return fmt.Errorf("%s is not a shared-memory address on this host", addr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "@"+name)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe %s: %w", addr, transport.ErrGone)
	}
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	defer c.Close()
	// Someone listens there; it is the worker only if it is its process (another user, or any
	// other process, may have bound the name of a worker that exited).
	if err := probeOwner(c.(*net.UnixConn), name); err != nil {
		return fmt.Errorf("probe %s: %v: %w", addr, err, transport.ErrGone)
	}
	return nil
}

// track registers s, so Close can end it; false (and s closed) if the transport is closed.
func (t *Transport) track(s *stream) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		go s.Close()
		return false
	}
	t.streams[s] = struct{}{}
	if !t.watching {
		t.watching = true
		go t.tend()
	}
	s.onClose = func() {
		t.mu.Lock()
		delete(t.streams, s)
		t.mu.Unlock()
	}
	return true
}

// StopListening stops accepting streams; those open go on until Close.
func (t *Transport) StopListening() {
	t.mu.Lock()
	lis := t.listener
	t.mu.Unlock()
	if lis != nil {
		lis.Close()
	}
}

// Close stops listening and ends every stream.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	lis := t.listener
	streams := t.streams
	t.streams = map[*stream]struct{}{}
	t.mu.Unlock()
	if lis != nil {
		lis.Close()
	}
	for s := range streams {
		s.Close()
	}
	return nil
}

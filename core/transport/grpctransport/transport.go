// Package grpctransport is the transport of real worlds: each agent serves one gRPC service,
// and a caller opens one long-lived stream per callee, two bidirectional gRPC streams (lanes.go),
// that carries msgpack frames (package wire) multiplexed by call id. Every connection is guarded by the world's
// token and TLS files (package secure's policy).
package grpctransport

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/internal/secure"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/internal/tcpconn"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
)

const (
	agentService    = "tensorplay.rpc.Agent"
	agentStreamPath = "/" + agentService + "/Stream"
)

var agentStreamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

// Transport is the transport.Transport of real worlds: one gRPC server per agent and one
// client connection with one bidirectional stream per peer dialed.
type Transport struct {
	sec secure.World
	// localIP is the address this transport listens on; streams it dials leave from it, so
	// peers can check that a stream comes from the host the worker registered.
	localIP net.IP

	mu      sync.Mutex
	server  *grpc.Server
	conns   []*grpc.ClientConn
	streams map[*grpcClientStream]struct{}
	closed  bool

	pairs pairings // halves of incoming streams waiting for each other
}

// New returns a transport that is not yet listening. A non-empty token is presented on every
// stream it opens and required on every stream it accepts; with tlsFiles, every connection is
// mutual TLS under the world's CA.
func New(token string, tlsFiles *secure.TLSFiles) (*Transport, error) {
	sec, err := secure.New(token, tlsFiles)
	if err != nil {
		return nil, err
	}
	return &Transport{sec: sec, streams: map[*grpcClientStream]struct{}{}}, nil
}

// SetPeerTimeout bounds how long a connection whose peer stopped answering lives (see
// core.Config.PeerTimeout); call it before Listen and Dial. 0 keeps the default.
func (t *Transport) SetPeerTimeout(d time.Duration) {
	t.sec = t.sec.WithPeerTimeout(d)
}

// Listen serves agent streams on host at a port the OS picks.
func (t *Transport) Listen(host string, serve func(transport.Stream)) (string, error) {
	tcp, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("listen on %s: %w", host, err)
	}
	lis := userTimeoutListener{Listener: tcp, timeout: t.sec.PeerTimeout()}
	t.sec.WarnIfOpen("worker", host, "make this worker unpickle, and so run, anything")
	srv := grpc.NewServer(t.sec.ServerOptions()...)
	t.localIP = tcpconn.ListenIP(host)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: agentService,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Stream",
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				return t.serveHalf(ss, serve)
			},
		}},
	}, struct{}{})
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		lis.Close()
		return "", transport.ErrClosed
	}
	t.server = srv
	t.mu.Unlock()
	go srv.Serve(lis)
	return lis.Addr().String(), nil
}

// Dial opens a stream to addr, failing fast if nothing listens there.
func (t *Transport) Dial(ctx context.Context, addr string) (transport.Stream, error) {
	opts := append(t.sec.DialOptions(), grpc.WithContextDialer(t.dialWithUserTimeout))
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	// The stream outlives ctx; ctx bounds only its set-up.
	stop := context.AfterFunc(ctx, cancel)
	small, bulk, err := openLanes(sctx, cc)
	if !stop() || err != nil {
		cancel()
		cc.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("open stream to %s: %w", addr, err)
	}
	s := &grpcClientStream{laned: newLaned(small, bulk, false), cc: cc, cancel: cancel, owner: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		s.close()
		return nil, transport.ErrClosed
	}
	t.streams[s] = struct{}{}
	return s, nil
}

// Probe implements transport.Prober.
func (t *Transport) Probe(ctx context.Context, addr string) error {
	return tcpconn.Probe(ctx, addr, t.localIP)
}

// StopListening stops the server at once (its own streams with it); dialed streams go on
// until Close.
func (t *Transport) StopListening() {
	t.mu.Lock()
	srv := t.server
	t.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// Close stops the server at once and breaks every dialed stream. The server goes first: a
// peer that sees this worker's streams end and probes it must find it gone.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	srv := t.server
	streams := t.streams
	t.streams = map[*grpcClientStream]struct{}{}
	t.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	for s := range streams {
		s.close()
	}
	return nil
}

// Both ends of a stream decode chunks in place and say who opened them.
var (
	_ transport.SinkSetter       = (*grpcServerStream)(nil)
	_ transport.Laned            = (*grpcClientStream)(nil)
	_ transport.IdentifiedStream = (*grpcServerStream)(nil)
)

type grpcServerStream struct {
	ss   grpc.ServerStream
	sink wire.ChunkSink
}

func (s *grpcServerStream) SetChunkSink(sink wire.ChunkSink) { s.sink = sink }

// Identity implements transport.IdentifiedStream: the peer's address and its certificate's names.
func (s *grpcServerStream) Identity() transport.PeerIdentity {
	p, ok := grpcpeer.FromContext(s.ss.Context())
	if !ok {
		return transport.PeerIdentity{}
	}
	id := transport.PeerIdentity{Addr: p.Addr.String()}
	if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
		leaf := info.State.PeerCertificates[0]
		if leaf.Subject.CommonName != "" {
			id.Names = append(id.Names, leaf.Subject.CommonName)
		}
		id.Names = append(id.Names, leaf.DNSNames...)
	}
	return id
}
func (s *grpcServerStream) Send(f *wire.Frame) error { return s.ss.SendMsg(f) }
func (s *grpcServerStream) Recv() (*wire.Frame, error) {
	f := &wire.Frame{Sink: s.sink}
	if err := recvFrame(s.ss, f); err != nil {
		return nil, err
	}
	return f, nil
}

// Close is a no-op: a server stream ends when its serve function returns.
func (s *grpcServerStream) Close() error { return nil }

// grpcClientStream is a dialed stream: its two lanes on a connection of its own.
type grpcClientStream struct {
	*laned
	cc     *grpc.ClientConn
	cancel context.CancelFunc
	owner  *Transport
	once   sync.Once
}

func (s *grpcClientStream) Close() error {
	s.owner.mu.Lock()
	delete(s.owner.streams, s)
	s.owner.mu.Unlock()
	s.close()
	return nil
}

func (s *grpcClientStream) close() {
	s.once.Do(func() {
		s.cancel()
		s.cc.Close()
		s.end()
	})
}

package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	grpcpeer "google.golang.org/grpc/peer"

	"github.com/tensorplay/tensorplay-rpc/core/internal/msgpackcodec"
)

const (
	agentService    = "tensorplay.rpc.Agent"
	agentStreamPath = "/" + agentService + "/Stream"
	// The flow-control window: big enough to keep loopback busy, small enough that a small
	// call queued behind a big transfer waits at most a few milliseconds (measured: 16 MiB
	// windows gave 25 ms small-call p99 during a 256 MiB transfer, 4 MiB gave 16 ms).
	grpcWindow = 4 << 20
	// maxFrameBytes bounds one gRPC message: bigger data travels in chunks, so a peer that
	// announces more is refused before gRPC allocates what it claims.
	maxFrameBytes = 16 << 20
	// maxStreamsPerConn, maxHeaderBytes and handshakeTimeout bound what any connection,
	// authenticated or not, can hold on the server.
	maxStreamsPerConn = 16
	maxHeaderBytes    = 8 << 10
	handshakeTimeout  = 10 * time.Second
)

var agentStreamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

// fastBackoff reconnects within tens of milliseconds: peers on a LAN come up quickly, and
// gRPC's default one-second base delay would dominate init time.
var fastBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
	MinConnectTimeout: 2 * time.Second,
}

// grpcServerOptions bounds what a peer can make the server hold before it has shown the
// token, and checks the token of every stream before gRPC hands it to a handler.
func grpcServerOptions(sec security) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.InTapHandle(sec.tap),
		grpc.ForceServerCodecV2(msgpackcodec.Codec{}),
		grpc.MaxRecvMsgSize(maxFrameBytes),
		grpc.MaxSendMsgSize(maxFrameBytes),
		// A worker opens one stream per connection, and a store client one call at a time.
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.MaxHeaderListSize(maxHeaderBytes),
		// A connection that has not finished its handshake by then is dropped.
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	}
	if sec.server != nil {
		opts = append(opts, grpc.Creds(sec.server))
	}
	return opts
}

func grpcDialOptions(sec security) []grpc.DialOption {
	creds := sec.client
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(fastBackoff),
		// A peer lost without a word (a cable, a partition) is noticed in about two seconds,
		// not at the RPC timeout; a killed one is noticed at once by its closed socket.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: time.Second, Timeout: time.Second, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(grpcWindow),
		grpc.WithInitialConnWindowSize(grpcWindow),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(msgpackcodec.Codec{}),
			grpc.MaxCallRecvMsgSize(maxFrameBytes),
			grpc.MaxCallSendMsgSize(maxFrameBytes),
		),
	}
	if sec.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenCredentials(sec.token)))
	}
	return opts
}

// GRPCTransport is the Transport of real worlds: one gRPC server per agent and one client
// connection with one bidirectional stream per peer dialed.
type GRPCTransport struct {
	sec security
	// localIP is the address this transport listens on; streams it dials leave from it, so
	// peers can check that a stream comes from the host the worker registered.
	localIP net.IP

	mu      sync.Mutex
	server  *grpc.Server
	conns   []*grpc.ClientConn
	streams map[*grpcClientStream]struct{}
	closed  bool
}

// NewGRPCTransport returns a transport that is not yet listening. A non-empty token is
// presented on every stream it opens and required on every stream it accepts; with tlsFiles,
// every connection is mutual TLS under the world's CA.
func NewGRPCTransport(token string, tlsFiles *TLSFiles) (*GRPCTransport, error) {
	sec, err := newSecurity(token, tlsFiles)
	if err != nil {
		return nil, err
	}
	return &GRPCTransport{sec: sec, streams: map[*grpcClientStream]struct{}{}}, nil
}

// Listen serves agent streams on host at a port the OS picks.
func (t *GRPCTransport) Listen(host string, serve func(Stream)) (string, error) {
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("listen on %s: %w", host, err)
	}
	if t.sec.token == "" && !net.ParseIP(host).IsLoopback() {
		warnOpenOnce.Do(func() {
			slog.Warn("tensorplay-rpc: listening on " + host + " without a token: anyone who can reach this port can make this worker unpickle, and so run, anything. Set TENSORPLAY_RPC_TOKEN on every worker.")
		})
	}
	srv := grpc.NewServer(grpcServerOptions(t.sec)...)
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		t.localIP = ip
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: agentService,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Stream",
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				serve(&grpcServerStream{ss: ss})
				return nil
			},
		}},
	}, struct{}{})
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		lis.Close()
		return "", ErrShutdown
	}
	t.server = srv
	t.mu.Unlock()
	go srv.Serve(lis)
	return lis.Addr().String(), nil
}

// Dial opens a stream to addr, failing fast if nothing listens there.
func (t *GRPCTransport) Dial(ctx context.Context, addr string) (Stream, error) {
	opts := grpcDialOptions(t.sec)
	if t.localIP != nil {
		opts = append(opts, grpc.WithContextDialer(t.dialFromLocalIP))
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	// The stream outlives ctx; ctx bounds only its set-up.
	stop := context.AfterFunc(ctx, cancel)
	cs, err := cc.NewStream(sctx, &agentStreamDesc, agentStreamPath)
	if !stop() || err != nil {
		cancel()
		cc.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("open stream to %s: %w", addr, err)
	}
	s := &grpcClientStream{cs: cs, cc: cc, cancel: cancel, owner: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		s.close()
		return nil, ErrShutdown
	}
	t.streams[s] = struct{}{}
	return s, nil
}

// dialFromLocalIP connects to addr from the address this transport listens on, unless that
// cannot reach it (a loopback address toward another host).
func (t *GRPCTransport) dialFromLocalIP(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() == t.localIP.IsLoopback() {
			d.LocalAddr = &net.TCPAddr{IP: t.localIP}
		}
	}
	return d.DialContext(ctx, "tcp", addr)
}

// Close stops the server at once and breaks every dialed stream. The server goes first: a
// peer that sees this worker's streams end and probes it must find it gone.
func (t *GRPCTransport) Close() error {
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

// chunkSink is where a stream's reader wants chunk bytes decoded to: dst, or nowhere (dst nil
// and ok set) for a message being dropped; ok unset refuses the chunk.
type chunkSink = func(id uint64, offset int64, n int) (dst []byte, ok bool)

// sinkSetter is implemented by streams that decode frames, so chunks can be decoded in place.
type sinkSetter interface{ setChunkSink(chunkSink) }

type grpcServerStream struct {
	ss   grpc.ServerStream
	sink chunkSink
}

func (s *grpcServerStream) setChunkSink(sink chunkSink) { s.sink = sink }

// Identity implements IdentifiedStream: the peer's address and its certificate's names.
func (s *grpcServerStream) Identity() PeerIdentity {
	p, ok := grpcpeer.FromContext(s.ss.Context())
	if !ok {
		return PeerIdentity{}
	}
	id := PeerIdentity{Addr: p.Addr.String()}
	if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 {
		leaf := info.State.PeerCertificates[0]
		if leaf.Subject.CommonName != "" {
			id.Names = append(id.Names, leaf.Subject.CommonName)
		}
		id.Names = append(id.Names, leaf.DNSNames...)
	}
	return id
}
func (s *grpcServerStream) Send(f *Frame) error { return s.ss.SendMsg(f) }
func (s *grpcServerStream) Recv() (*Frame, error) {
	f := &Frame{chunkSink: s.sink}
	if err := s.ss.RecvMsg(f); err != nil {
		return nil, err
	}
	return f, nil
}

// Close is a no-op: a server stream ends when its serve function returns.
func (s *grpcServerStream) Close() error { return nil }

type grpcClientStream struct {
	cs     grpc.ClientStream
	cc     *grpc.ClientConn
	cancel context.CancelFunc
	owner  *GRPCTransport
	once   sync.Once
	sink   chunkSink
}

func (s *grpcClientStream) setChunkSink(sink chunkSink) { s.sink = sink }
func (s *grpcClientStream) Send(f *Frame) error         { return s.cs.SendMsg(f) }
func (s *grpcClientStream) Recv() (*Frame, error) {
	f := &Frame{chunkSink: s.sink}
	if err := s.cs.RecvMsg(f); err != nil {
		return nil, err
	}
	return f, nil
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
	})
}

var warnOpenOnce sync.Once

// errStreamClosed is what Recv reports on a stream closed locally.
var errStreamClosed = errors.New("stream closed")

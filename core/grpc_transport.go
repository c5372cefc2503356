package core

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

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
)

var agentStreamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

// fastBackoff reconnects within tens of milliseconds: peers on a LAN come up quickly, and
// gRPC's default one-second base delay would dominate init time.
var fastBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
	MinConnectTimeout: 2 * time.Second,
}

// tokenHeader carries a world's shared secret on every gRPC call and stream.
const tokenHeader = "tensorplay-token"

// tokenCredentials attaches the world's token to every call.
type tokenCredentials string

func (t tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{tokenHeader: string(t)}, nil
}

// RequireTransportSecurity is false: the token also guards plaintext worlds (see TLS for
// keeping it secret on the wire).
func (tokenCredentials) RequireTransportSecurity() bool { return false }

// checkToken refuses a call that does not carry token, before any of its messages is decoded.
func checkToken(ctx context.Context, token string) error {
	if token == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get(tokenHeader); len(got) == 1 && subtle.ConstantTimeCompare([]byte(got[0]), []byte(token)) == 1 {
		return nil
	}
	from := "an unknown address"
	if p, ok := grpcpeer.FromContext(ctx); ok {
		from = p.Addr.String()
	}
	slog.Warn("tensorplay-rpc: refused a connection without the world's token", "from", from)
	return status.Error(codes.Unauthenticated, "this world requires its token (TENSORPLAY_RPC_TOKEN)")
}

// grpcServerOptions checks the token of every stream before its handler reads a message;
// unary handlers (the store's) check it themselves, before decoding their request.
func grpcServerOptions(sec security) []grpc.ServerOption {
	token := sec.token
	opts := []grpc.ServerOption{
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := checkToken(ss.Context(), token); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
		grpc.ForceServerCodecV2(msgpackcodec.Codec{}),
		grpc.MaxRecvMsgSize(maxFrameBytes),
		grpc.MaxSendMsgSize(maxFrameBytes),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	}
	if sec.server != nil {
		opts = append(opts, grpc.Creds(sec.server))
	}
	return opts
}

// security is what guards a world's connections: its token and its TLS credentials.
type security struct {
	token          string
	server, client credentials.TransportCredentials // nil without TLS
}

func newSecurity(token string, files *TLSFiles) (security, error) {
	sec := security{token: token}
	if files != nil {
		var err error
		if sec.server, sec.client, err = files.credentials(); err != nil {
			return security{}, err
		}
	}
	return sec, nil
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
	sec     security
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
	cc, err := grpc.NewClient("passthrough:///"+addr, grpcDialOptions(t.sec)...)
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

// Close stops the server at once and breaks every dialed stream.
func (t *GRPCTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	srv := t.server
	streams := t.streams
	t.streams = map[*grpcClientStream]struct{}{}
	t.mu.Unlock()
	for s := range streams {
		s.close()
	}
	if srv != nil {
		srv.Stop()
	}
	return nil
}

// chunkSink is where a stream's reader wants chunk bytes decoded to.
type chunkSink = func(id uint64, offset int64, n int) []byte

// sinkSetter is implemented by streams that decode frames, so chunks can be decoded in place.
type sinkSetter interface{ setChunkSink(chunkSink) }

type grpcServerStream struct {
	ss   grpc.ServerStream
	sink chunkSink
}

func (s *grpcServerStream) setChunkSink(sink chunkSink) { s.sink = sink }
func (s *grpcServerStream) Send(f *Frame) error         { return s.ss.SendMsg(f) }
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

package core

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

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

func grpcServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(msgpackcodec.Codec{}),
		grpc.MaxRecvMsgSize(maxFrameBytes),
		grpc.MaxSendMsgSize(maxFrameBytes),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	}
}

func grpcDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(fastBackoff),
		grpc.WithInitialWindowSize(grpcWindow),
		grpc.WithInitialConnWindowSize(grpcWindow),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(msgpackcodec.Codec{}),
			grpc.MaxCallRecvMsgSize(maxFrameBytes),
			grpc.MaxCallSendMsgSize(maxFrameBytes),
		),
	}
}

// GRPCTransport is the Transport of real worlds: one gRPC server per agent and one client
// connection with one bidirectional stream per peer dialed.
type GRPCTransport struct {
	mu      sync.Mutex
	server  *grpc.Server
	conns   []*grpc.ClientConn
	streams map[*grpcClientStream]struct{}
	closed  bool
}

// NewGRPCTransport returns a transport that is not yet listening.
func NewGRPCTransport() *GRPCTransport {
	return &GRPCTransport{streams: map[*grpcClientStream]struct{}{}}
}

// Listen serves agent streams on host at a port the OS picks.
func (t *GRPCTransport) Listen(host string, serve func(Stream)) (string, error) {
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("listen on %s: %w", host, err)
	}
	srv := grpc.NewServer(grpcServerOptions()...)
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
	cc, err := grpc.NewClient("passthrough:///"+addr, grpcDialOptions()...)
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

// errStreamClosed is what Recv reports on a stream closed locally.
var errStreamClosed = errors.New("stream closed")

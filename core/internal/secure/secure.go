// Package secure is how every gRPC connection of a world is guarded and shaped, the store's
// and the workers' alike: the world's token (checked at gRPC's tap, before a stream exists),
// its TLS files, and the server and dial options that bound what a peer can make a server
// hold.
package secure

import (
	"cmp"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/internal/msgpackcodec"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// tokenHeader carries a world's shared secret on every gRPC call and stream.
const tokenHeader = "tensorplay-token"

// World is what guards a world's connections: its token and its TLS credentials.
type World struct {
	token          string
	server, client credentials.TransportCredentials // nil without TLS
	serverTLS      *tls.Config                      // nil without TLS; cloned before use
	clientTLS      *tls.Config
	refusals       *refusalLog
	peerTimeout    time.Duration // 0: defaultPeerTimeout
}

// WithPeerTimeout returns the world with connections whose peer stopped answering ended after
// about d (0: the default).
func (sec World) WithPeerTimeout(d time.Duration) World {
	sec.peerTimeout = d
	return sec
}

// PeerTimeout is how long a connection whose peer stopped answering lives.
func (sec World) PeerTimeout() time.Duration { return cmp.Or(sec.peerTimeout, defaultPeerTimeout) }

// keepalive splits the peer timeout into how long a connection may be silent before a ping
// and how long the ping's answer may take. gRPC-Go's client pings at most every
// minClientPingEvery whatever it is told.
func (sec World) keepalive() (every, answerWithin time.Duration) {
	d := sec.PeerTimeout()
	every = max(minClientPingEvery, d/3)
	return every, max(time.Second, d-every)
}

// New guards connections with token, if not empty, and with mutual TLS, if files is set.
func New(token string, files *TLSFiles) (World, error) {
	sec := World{token: token, refusals: newRefusalLog(time.Minute)}
	if files != nil {
		var err error
		if sec.serverTLS, sec.clientTLS, err = files.configs(); err != nil {
			return World{}, err
		}
		sec.server, sec.client = credentials.NewTLS(sec.serverTLS), credentials.NewTLS(sec.clientTLS)
	}
	return sec, nil
}

// ServerTLS is the TLS configuration a transport that does its own TLS accepts connections
// with, or nil for a world without TLS.
func (sec World) ServerTLS() *tls.Config {
	if sec.serverTLS == nil {
		return nil
	}
	return sec.serverTLS.Clone()
}

// ClientTLS is the TLS configuration a transport that does its own TLS dials with, or nil.
func (sec World) ClientTLS() *tls.Config {
	if sec.clientTLS == nil {
		return nil
	}
	return sec.clientTLS.Clone()
}

// HandshakeTimeout bounds how long a connection may take to show who it is (TLS and the
// token) before the server drops it.
func (sec World) HandshakeTimeout() time.Duration { return handshakeTimeout }

// HasToken reports whether the world has a token.
func (sec World) HasToken() bool { return sec.token != "" }

// WarnIfOpen warns, once per kind of server (what), when one listens on host, an address other
// than loopback, without a token, saying what anyone who reaches it can do (risk).
func (sec World) WarnIfOpen(what, host, risk string) {
	if sec.token != "" || net.ParseIP(host).IsLoopback() {
		return
	}
	once, _ := openWarnings.LoadOrStore(what, new(sync.Once))
	once.(*sync.Once).Do(func() {
		slog.Warn("tensorplay-rpc: the " + what + " listens on " + host + " without a token: anyone who can reach this port can " + risk + ". Set TENSORPLAY_RPC_TOKEN on every worker.")
	})
}

var openWarnings sync.Map // what → *sync.Once

// ForgetWarnings lets the next WarnIfOpen of every kind warn again; tests of packages that
// serve use it.
func ForgetWarnings() { openWarnings.Clear() }

// tokenCredentials attaches the world's token to every call.
type tokenCredentials string

func (t tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{tokenHeader: string(t)}, nil
}

// RequireTransportSecurity is false: the token also guards plaintext worlds (see TLS for
// keeping it secret on the wire).
func (tokenCredentials) RequireTransportSecurity() bool { return false }

// tap refuses a stream that does not carry the token as soon as its headers arrive, before
// gRPC creates it or reads any of its messages.
func (sec World) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if sec.token == "" {
		return ctx, nil
	}
	if got := info.Header.Get(tokenHeader); len(got) == 1 && subtle.ConstantTimeCompare([]byte(got[0]), []byte(sec.token)) == 1 {
		return ctx, nil
	}
	from := "an unknown address"
	if p, ok := grpcpeer.FromContext(ctx); ok {
		from = p.Addr.String()
	}
	sec.refusals.note(from)
	return ctx, status.Error(codes.Unauthenticated, "this world requires its token (TENSORPLAY_RPC_TOKEN)")
}

// CheckToken reports whether got is the world's token (always, for a world without one),
// noting a refusal of the connection from from if it is not. For transports that carry the
// token themselves rather than in gRPC headers.
func (sec World) CheckToken(got []byte, from string) bool {
	if sec.token == "" || subtle.ConstantTimeCompare(got, []byte(sec.token)) == 1 {
		return true
	}
	sec.refusals.note(from)
	return false
}

// Token is the token a dialing transport presents ("" for a world without one).
func (sec World) Token() string { return sec.token }

// refusalLog logs refused connections at most once per peer host per interval, with the
// number refused since the last line, so a flood of strangers cannot flood the log.
type refusalLog struct {
	every time.Duration

	mu    sync.Mutex
	hosts map[string]*refusals
}

type refusals struct {
	logged time.Time
	since  int // refused since the last line
}

// maxRefusalHosts bounds the hosts remembered; past it, the oldest are forgotten.
const maxRefusalHosts = 1024

func newRefusalLog(every time.Duration) *refusalLog {
	return &refusalLog{every: every, hosts: map[string]*refusals{}}
}

// note counts a refusal of a connection from addr and logs it if its host's turn has come.
func (l *refusalLog) note(addr string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	now := time.Now()
	l.mu.Lock()
	r := l.hosts[host]
	if r == nil {
		if len(l.hosts) >= maxRefusalHosts {
			l.forgetOldest()
		}
		r = &refusals{}
		l.hosts[host] = r
	}
	r.since++
	if !r.logged.IsZero() && now.Sub(r.logged) < l.every {
		l.mu.Unlock()
		return
	}
	count := r.since
	r.logged, r.since = now, 0
	l.mu.Unlock()
	slog.Warn("tensorplay-rpc: refused connections without the world's token", "from", host, "count", count, "next_report_in", fmt.Sprint(l.every))
}

// forgetOldest drops the host logged longest ago; l.mu is held.
func (l *refusalLog) forgetOldest() {
	var oldest string
	var at time.Time
	for h, r := range l.hosts {
		if oldest == "" || r.logged.Before(at) {
			oldest, at = h, r.logged
		}
	}
	delete(l.hosts, oldest)
}

const (
	// The flow-control window: big enough to keep loopback busy, small enough that a small
	// call queued behind a big transfer waits at most a few milliseconds (measured: 16 MiB
	// windows gave 25 ms small-call p99 during a 256 MiB transfer, 4 MiB gave 16 ms).
	grpcWindow = 4 << 20
	// maxStreamsPerConn, maxHeaderBytes and handshakeTimeout bound what any connection,
	// authenticated or not, can hold on the server.
	maxStreamsPerConn = 16
	maxHeaderBytes    = 8 << 10
	handshakeTimeout  = 10 * time.Second
)

// fastBackoff reconnects within tens of milliseconds: peers on a LAN come up quickly, and
// gRPC's default one-second base delay would dominate init time.
var fastBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
	MinConnectTimeout: 2 * time.Second,
}

// ServerOptions bounds what a peer can make the server hold before it has shown the
// token, and checks the token of every stream before gRPC hands it to a handler.
func (sec World) ServerOptions() []grpc.ServerOption {
	every, answerWithin := sec.keepalive()
	opts := []grpc.ServerOption{
		grpc.InTapHandle(sec.tap),
		grpc.ForceServerCodecV2(msgpackcodec.Codec{}),
		grpc.MaxRecvMsgSize(wire.MaxFrameBytes),
		grpc.MaxSendMsgSize(wire.MaxFrameBytes),
		// A worker opens one stream per connection, and a store client one call at a time.
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.MaxHeaderListSize(maxHeaderBytes),
		// A connection that has not finished its handshake by then is dropped.
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		// Any worker's pings are welcome, whatever its own peer timeout.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minClientPingEvery / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: every, Timeout: answerWithin}),
	}
	if sec.server != nil {
		opts = append(opts, grpc.Creds(sec.server))
	}
	return opts
}

// A peer lost without a word (a cable, a partition) is noticed within the peer timeout, well
// inside the default RPC timeout; a killed one is noticed at once by its closed socket. The
// timeout is long because a loaded host is not a dead one: with a 1 s ping timeout, a world of
// 256 workers on 2 cores (or -race tests in parallel) lost live peers to late ping replies.
// (core.DefaultPeerTimeout is the same; this package cannot import core.)
const (
	defaultPeerTimeout = 30 * time.Second
	minClientPingEvery = 10 * time.Second
)

// DialOptions connects to a world's servers with its token and TLS files.
func (sec World) DialOptions() []grpc.DialOption {
	creds := sec.client
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	every, answerWithin := sec.keepalive()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(fastBackoff),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: every, Timeout: answerWithin, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(grpcWindow),
		grpc.WithInitialConnWindowSize(grpcWindow),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(msgpackcodec.Codec{}),
			grpc.MaxCallRecvMsgSize(wire.MaxFrameBytes),
			grpc.MaxCallSendMsgSize(wire.MaxFrameBytes),
		),
	}
	if sec.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenCredentials(sec.token)))
	}
	return opts
}

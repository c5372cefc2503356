package grpctransport

import (
	"context"
	"net"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport/internal/tcpconn"
)

// TCP_USER_TIMEOUT. gRPC-Go sets it on every connection to its keepalive's answer time (the
// peer timeout less the ping interval: 2 s of a 12 s peer timeout), and Linux applies it to
// zero-window probes too: a peer paused with its receive window full (a big message on its
// way to a process in a debugger) would lose its connection after those 2 s, not after the
// peer timeout. So connections get the whole peer timeout here, and reach gRPC without the
// syscall.Conn it would set its own through.

// dialWithUserTimeout dials addr (from the address this transport listens on, where that can
// reach it) for gRPC.
func (t *Transport) dialWithUserTimeout(ctx context.Context, addr string) (net.Conn, error) {
	c, err := tcpconn.Dial(ctx, addr, t.localIP)
	if err != nil {
		return nil, err
	}
	return withUserTimeout(c, t.sec.PeerTimeout()), nil
}

// userTimeoutListener accepts connections with the peer timeout as their user timeout.
type userTimeoutListener struct {
	net.Listener
	timeout time.Duration
}

func (l userTimeoutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return withUserTimeout(c, l.timeout), nil
}

// connWithoutSyscall is a connection gRPC cannot reach the socket of.
type connWithoutSyscall struct{ net.Conn }

func withUserTimeout(c net.Conn, d time.Duration) net.Conn {
	tcpconn.SetUserTimeout(c, d)
	return connWithoutSyscall{c}
}

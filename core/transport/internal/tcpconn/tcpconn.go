// Package tcpconn is what the transports over TCP (gRPC's and the plain one) do alike with
// their connections: dial from the address they listen on, give each connection the peer
// timeout as its TCP user timeout, and probe whether a worker's process is still there.
package tcpconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"golang.org/x/sys/unix"
)

// Dial connects to addr from localIP (the address the dialing transport listens on, so peers
// can check that a stream comes from the host the worker registered), unless localIP is nil
// or cannot reach addr (a loopback address toward another host).
func Dial(ctx context.Context, addr string, localIP net.IP) (net.Conn, error) {
	var d net.Dialer
	if host, _, err := net.SplitHostPort(addr); err == nil && localIP != nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() == localIP.IsLoopback() && (ip.To4() == nil) == (localIP.To4() == nil) {
			d.LocalAddr = &net.TCPAddr{IP: localIP}
		}
	}
	return d.DialContext(ctx, "tcp", addr)
}

// SetUserTimeout sets c's TCP_USER_TIMEOUT to d: data the peer has not acknowledged for d (a
// cut cable, a host gone) breaks the connection. Linux applies it to zero-window probes too,
// so d must be the whole peer timeout: a peer paused with its receive window full (a process
// in a debugger) must keep its connection that long.
func SetUserTimeout(c net.Conn, d time.Duration) {
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
			})
		}
	}
}

// Probe implements transport.Prober for a transport listening on TCP: a host that refuses a
// connection to a worker's port has no listener there, so the worker's process is gone; no
// answer says nothing.
func Probe(ctx context.Context, addr string, localIP net.IP) error {
	c, err := Dial(ctx, addr, localIP)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe %s: %w", addr, transport.ErrGone)
	}
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	return c.Close()
}

// ListenIP is the address a transport listening on host dials from: host's IP, or nil for a
// name or an unspecified address.
func ListenIP(host string) net.IP {
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		return ip
	}
	return nil
}

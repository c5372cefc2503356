package shmtransport

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// Admission to the listener. An abstract socket has no permissions: any local user can connect
// to it (and /proc/net/unix lists the names), so what a connection costs before its dialer is
// known to be this user must stay small and bounded, and no error of accept may end the
// listener for good.
const (
	// preAuthTimeout bounds reading a dialer's hello (magic and token); the rest of the set-up
	// has handshakeTimeout.
	preAuthTimeout = time.Second
	// maxHandshakes bounds set-ups in flight. Only this user's connections get that far (another
	// user's are closed at accept), so this is the per-user and the total bound at once.
	maxHandshakes = 64
	// acceptBackoffMin and acceptBackoffMax bound the pause after a failed accept (out of file
	// descriptors, say), doubling from one to the other, as net/http and gRPC's servers do.
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// unixAcceptor is what the accept loop needs of a listener (the seam tests fail accepts with).
type unixAcceptor interface {
	AcceptUnix() (*net.UnixConn, error)
}

// admission counts the set-ups in flight of one transport.
type admission struct {
	inFlight atomic.Int32
}

// accept takes connections until lis is closed: one of another user is closed at once, before
// anything is read; one over maxHandshakes in flight is closed too; a failed accept that is not
// the listener's end is retried after a pause.
func (t *Transport) accept(lis unixAcceptor, serve func(transport.Stream)) {
	var backoff time.Duration
	for {
		conn, err := lis.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			slog.Warn("tensorplay-rpc: accepting a shared-memory stream failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if uid, ok := peerUID(conn); !ok || uid != os.Getuid() {
			slog.Debug("tensorplay-rpc: refused a shared-memory stream of another user", "from", peerName(conn))
			conn.Close()
			continue
		}
		if t.admission.inFlight.Add(1) > maxHandshakes {
			t.admission.inFlight.Add(-1)
			slog.Warn("tensorplay-rpc: refused a shared-memory stream: too many set-ups in flight", "from", peerName(conn), "limit", maxHandshakes)
			conn.Close()
			continue
		}
		go t.setUp(conn, serve)
	}
}

// probeOwner checks that the process listening at the other end of conn, which was dialed at
// the abstract socket name, is the worker that registered it: this user's, and the process whose
// pid the name holds (tensorplay-rpc/<pid>/<nonce>). Another user can bind a dead worker's name.
func probeOwner(conn *net.UnixConn, name string) error {
	cred, ok := peerCred(conn)
	if !ok {
		return fmt.Errorf("cannot tell who listens at %s", name)
	}
	if int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("%s is held by another user (uid %d)", name, cred.Uid)
	}
	if pid, ok := pidOfName(name); ok && cred.Pid != 0 && !samePID(int(cred.Pid), pid) {
		return fmt.Errorf("%s is held by process %d, not by the worker's process %d", name, cred.Pid, pid)
	}
	return nil
}

// samePID reports whether the process seen here as pid is the one its own PID namespace calls
// own (a worker in a container names itself by its pid there): one of the pids the kernel
// lists for it, one per namespace it is in (NSpid).
func samePID(pid, own int) bool {
	if pid == own {
		return true
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			for _, field := range strings.Fields(rest) {
				if field == strconv.Itoa(own) {
					return true
				}
			}
		}
	}
	return false
}

// pidOfName is the pid a listener's name holds, if it is one of Listen's names.
func pidOfName(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "tensorplay-rpc/")
	if !ok {
		return 0, false
	}
	pid, _, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(pid)
	return n, err == nil && n > 0
}

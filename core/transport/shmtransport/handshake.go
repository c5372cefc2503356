package shmtransport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The set-up of a stream, on the Unix socket the dialer opened:
//
//	dialer:   magic, token length (u32), token
//	listener: handshakeOK, or handshakeRefused and it hangs up
//	dialer:   ring size (u32), with the region's memfd attached (SCM_RIGHTS)
//	listener: handshakeOK once it has checked and mapped the region
//
// The listener checks the token and the peer's user before it accepts any file descriptor, and
// checks the region's seals and size before it maps it. Each side offers to lend the other big
// byte strings, and checks whether it can read what the other lends (lending.go), before its
// last step: the dialer before it sends the region, the listener before its last OK. The magic
// names the region's layout: version 3 added the landing areas (placing.go).
var handshakeMagic = []byte("tprpcshm3")

const (
	handshakeOK      = 'K'
	handshakeRefused = 'X'
	// maxTokenBytes bounds the token a dialer may present.
	maxTokenBytes = 4096
	// handshakeTimeout bounds a set-up, so a silent dialer cannot hold a listener's goroutine.
	handshakeTimeout = 10 * time.Second
)

// ErrRefused is what a dialer sees when the listener will not take it.
var ErrRefused = errors.New("the worker refused the shared-memory stream (a different token, or a different user)")

// dialHandshake sets up a stream as the dialer: it creates the region, so it writes ring 0.
// l is the listener's process if this side reads what it lends (readLender), else nil.
func dialHandshake(conn *net.UnixConn, token string, ringBytes int, readLender bool) (mem []byte, l *lender, err error) {
	// Abstract socket names have no permissions: after a worker exits, another user could
	// bind its name. The token goes only to a listener of this user.
	if uid, ok := peerUID(conn); !ok || uid != os.Getuid() {
		return nil, nil, fmt.Errorf("%w: the socket belongs to another user", ErrRefused)
	}
	hello := make([]byte, 0, len(handshakeMagic)+4+len(token))
	hello = append(hello, handshakeMagic...)
	hello = append(hello, 0, 0, 0, 0)
	putUint32(hello[len(handshakeMagic):], uint32(len(token)))
	hello = append(hello, token...)
	if _, err := conn.Write(hello); err != nil {
		return nil, nil, err
	}
	if err := expectOK(conn); err != nil {
		return nil, nil, err
	}
	fd, mem, err := createRegion(ringBytes)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(fd) // the mapping keeps the memory; the peer gets its own descriptor
	offerLending(mem, ringBytes, 0)
	var size [4]byte
	putUint32(size[:], uint32(ringBytes))
	if _, _, err := conn.WriteMsgUnix(size[:], unix.UnixRights(fd), nil); err != nil {
		unix.Munmap(mem)
		return nil, nil, err
	}
	if err := expectOK(conn); err != nil {
		unix.Munmap(mem)
		return nil, nil, err
	}
	if readLender {
		l = acceptLending(mem, ringBytes, 1, peerPID(conn))
	}
	return mem, l, nil
}

func expectOK(conn *net.UnixConn) error {
	var answer [1]byte
	if _, err := io.ReadFull(conn, answer[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return ErrRefused
		}
		return err
	}
	if answer[0] != handshakeOK {
		return ErrRefused
	}
	return nil
}

// acceptHandshake sets up a stream as the listener, checking the dialer with checkToken, and
// calls authed once it has. l is the dialer's process if this side reads what it lends
// (readLender), else nil.
func acceptHandshake(conn *net.UnixConn, checkToken func(token []byte, from string) bool, readLender bool, authed func()) (mem []byte, ringBytes int, l *lender, err error) {
	from := peerName(conn)
	head := make([]byte, len(handshakeMagic)+4)
	if _, err := io.ReadFull(conn, head); err != nil {
		return nil, 0, nil, fmt.Errorf("read the hello of %s: %w", from, err)
	}
	if !bytes.Equal(head[:len(handshakeMagic)], handshakeMagic) {
		return nil, 0, nil, fmt.Errorf("%s did not open with the shared-memory handshake", from)
	}
	n := getUint32(head[len(handshakeMagic):])
	if n > maxTokenBytes {
		return nil, 0, nil, fmt.Errorf("%s presents a %d-byte token, more than %d", from, n, maxTokenBytes)
	}
	token := make([]byte, n)
	if _, err := io.ReadFull(conn, token); err != nil {
		return nil, 0, nil, fmt.Errorf("read the token of %s: %w", from, err)
	}
	if uid, ok := peerUID(conn); !ok || uid != os.Getuid() || !checkToken(token, from) {
		conn.Write([]byte{handshakeRefused})
		return nil, 0, nil, fmt.Errorf("refused %s: it is another user's or lacks the world's token", from)
	}
	authed()
	if _, err := conn.Write([]byte{handshakeOK}); err != nil {
		return nil, 0, nil, err
	}
	var size [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for a few descriptors, so extras are seen and closed
	k, oobn, _, _, err := conn.ReadMsgUnix(size[:], oob)
	fds := receivedFDs(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return nil, 0, nil, fmt.Errorf("read the region of %s: %w", from, err)
	}
	if k != len(size) || len(fds) != 1 {
		return nil, 0, nil, fmt.Errorf("%s sent %d bytes and %d descriptors, want 4 and 1", from, k, len(fds))
	}
	ringBytes = int(getUint32(size[:]))
	if mem, err = mapPeerRegion(fds[0], ringBytes); err != nil {
		return nil, 0, nil, fmt.Errorf("%s: %w", from, err)
	}
	offerLending(mem, ringBytes, 1)
	if readLender {
		l = acceptLending(mem, ringBytes, 0, peerPID(conn))
	}
	if _, err := conn.Write([]byte{handshakeOK}); err != nil {
		unix.Munmap(mem)
		l.close()
		return nil, 0, nil, err
	}
	return mem, ringBytes, l, nil
}

// receivedFDs is every descriptor in a control message, well-formed or not.
func receivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// peerCred is the user and process at the other end of conn, as the kernel saw them when the
// socket connected.
func peerCred(conn *net.UnixConn) (*unix.Ucred, bool) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, false
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	return cred, err == nil && cred != nil
}

// peerUID is the user of the process at the other end of conn.
func peerUID(conn *net.UnixConn) (int, bool) {
	cred, ok := peerCred(conn)
	if !ok {
		return 0, false
	}
	return int(cred.Uid), true
}

// peerPID is the process at the other end of conn (0 if unknown, as from another PID
// namespace).
func peerPID(conn *net.UnixConn) int {
	if cred, ok := peerCred(conn); ok {
		return int(cred.Pid)
	}
	return 0
}

// peerName names the process at the other end of conn, for logs and errors.
func peerName(conn *net.UnixConn) string {
	if pid := peerPID(conn); pid != 0 {
		return fmt.Sprintf("local process %d", pid)
	}
	return "a local process"
}

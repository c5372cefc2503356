package tcptransport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A connection opens with the dialer's hello: magic, version, the world's token, and which
// lane of which stream the connection is (lanes.go). The server reads nothing else before it
// has checked the token, and answers with one byte, accepted or refused, so a dialer with the
// wrong token learns it from Dial, not from a stream that ends later for no stated reason.
//
//	magic [8]byte  "tprpcTCP"
//	version byte   1
//	tokenLen uint16 (big-endian, at most maxTokenBytes)
//	token [tokenLen]byte
//	lane byte      laneSmall or laneBulk
//	pair [16]byte  the stream's name, the same on both its connections
var magic = [8]byte{'t', 'p', 'r', 'p', 'c', 'T', 'C', 'P'}

const (
	version       = 1
	maxTokenBytes = 4096
	helloHead     = len(magic) + 1 + 2
	helloTail     = 1 + pairBytes
	pairBytes     = 16

	answerAccepted byte = 1
	answerRefused  byte = 0
)

var (
	// errNotOurs is what a connection that does not speak this protocol is refused with.
	errNotOurs = errors.New("not a tensorplay-rpc TCP connection")
	// ErrRefused is what Dial reports when the worker refused this world's token.
	ErrRefused = errors.New("the worker refused the connection: this world requires its token (TENSORPLAY_RPC_TOKEN), the same on every worker")
)

// writeHello writes the dialer's hello carrying token, for lane of the stream pair.
func writeHello(w io.Writer, token string, lane byte, pair [pairBytes]byte) error {
	if len(token) > maxTokenBytes {
		return fmt.Errorf("the token is %d bytes, more than %d", len(token), maxTokenBytes)
	}
	b := make([]byte, 0, helloHead+len(token)+helloTail)
	b = append(b, magic[:]...)
	b = append(b, version)
	b = binary.BigEndian.AppendUint16(b, uint16(len(token)))
	b = append(b, token...)
	b = append(b, lane)
	b = append(b, pair[:]...)
	_, err := w.Write(b)
	return err
}

// readLane reads the rest of a hello, after its token: which lane of which stream the
// connection is.
func readLane(r io.Reader) (lane byte, pair [pairBytes]byte, err error) {
	var tail [helloTail]byte
	if _, err := io.ReadFull(r, tail[:]); err != nil {
		return 0, pair, fmt.Errorf("reading the hello's lane: %w", err)
	}
	copy(pair[:], tail[1:])
	if tail[0] != laneSmall && tail[0] != laneBulk {
		return 0, pair, fmt.Errorf("%w: lane %d", errNotOurs, tail[0])
	}
	return tail[0], pair, nil
}

// readToken reads a dialer's hello up to its token, which the server checks before it reads
// on. It reads at most helloHead+maxTokenBytes bytes.
func readToken(r io.Reader) ([]byte, error) {
	var head [helloHead]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("reading the hello: %w", err)
	}
	if !bytes.Equal(head[:len(magic)], magic[:]) {
		return nil, errNotOurs
	}
	if v := head[len(magic)]; v != version {
		return nil, fmt.Errorf("%w: version %d, want %d", errNotOurs, v, version)
	}
	n := int(binary.BigEndian.Uint16(head[len(magic)+1:]))
	if n > maxTokenBytes {
		return nil, fmt.Errorf("%w: a token of %d bytes", errNotOurs, n)
	}
	token := make([]byte, n)
	if _, err := io.ReadFull(r, token); err != nil {
		return nil, fmt.Errorf("reading the hello's token: %w", err)
	}
	return token, nil
}

// readAnswer reads the server's answer to the hello.
func readAnswer(r io.Reader) error {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("waiting for the worker to accept the connection: %w", err)
	}
	switch b[0] {
	case answerAccepted:
		return nil
	case answerRefused:
		return ErrRefused
	default:
		return fmt.Errorf("%w: the worker answered %d", errNotOurs, b[0])
	}
}

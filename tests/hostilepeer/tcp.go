package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport/tcptransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// rawTCP opens a plain-TCP agent stream by hand (the transport's own client frames everything
// correctly): both lanes' connections, each with its hello, token and pair, and the worker's
// one-byte answer. It returns the small lane's; the bulk lane's is kept open until the end.
func (p *peer) rawTCP(ctx context.Context) (*net.TCPConn, error) {
	var pair [16]byte
	rand.Read(pair[:])
	var small *net.TCPConn
	for _, lane := range []byte{1, 2} { // small, bulk
		c, err := p.rawLane(ctx, lane, pair)
		if err != nil {
			if small != nil {
				small.Close()
			}
			return nil, err
		}
		if small == nil {
			small = c
		} else {
			p.keep(func() { c.Close() })
		}
	}
	return small, nil
}

func (p *peer) rawLane(ctx context.Context, lane byte, pair [16]byte) (*net.TCPConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	hello := append([]byte("tprpcTCP"), 1)
	hello = binary.BigEndian.AppendUint16(hello, uint16(len(p.token)))
	hello = append(hello, p.token...)
	hello = append(hello, lane)
	hello = append(hello, pair[:]...)
	c.SetDeadline(time.Now().Add(p.window))
	var answer [1]byte
	if _, err = c.Write(hello); err == nil {
		_, err = io.ReadFull(c, answer[:])
	}
	if err == nil && answer[0] != 1 {
		err = tcptransport.ErrRefused
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c.(*net.TCPConn), nil
}

// tcpRecord is f as one record of the plain-TCP stream: its length, then its msgpack.
func tcpRecord(f *wire.Frame) []byte {
	var parts wire.Parts
	pieces, total, _ := parts.Encode(f)
	out := binary.BigEndian.AppendUint32(nil, uint32(total))
	for _, piece := range pieces {
		out = append(out, piece...)
	}
	return out
}

// tcpHugeMethod announces a 20 MiB record (a request whose method name is 20 MiB): over the
// frame limit, so the worker must end the stream without reading it.
func (p *peer) tcpHugeMethod(ctx context.Context) (string, string) {
	c, err := p.rawTCP(ctx)
	if err != nil {
		return dialOutcome(err)
	}
	defer c.Close()
	c.Write(tcpRecord(p.hello()))
	head := binary.BigEndian.AppendUint32(nil, 20*mib)
	c.SetWriteDeadline(time.Now().Add(p.window))
	_, sendErr := c.Write(append(head, strings.Repeat("m", mib)...))
	c.SetReadDeadline(time.Now().Add(p.window))
	_, err = io.Copy(io.Discard, c)
	detail := "a record of 20 MiB announced"
	if sendErr != nil {
		detail += " (send: " + describe(sendErr) + ")"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "silent", detail + "; no reaction"
	}
	return "dropped", detail + "; the worker closed the connection"
}

// tcpHalfClosed sends frames of a partial message on a raw connection and closes its sending
// side, leaving the connection held until the program ends.
func (p *peer) tcpHalfClosed(ctx context.Context, frames []*wire.Frame) string {
	c, err := p.rawTCP(ctx)
	if err != nil {
		return "; raw connection not opened: " + describe(err)
	}
	p.keep(func() { c.Close() })
	for _, f := range frames {
		if _, err = c.Write(tcpRecord(f)); err != nil {
			break
		}
	}
	if err == nil {
		err = c.CloseWrite()
	}
	if err != nil {
		return fmt.Sprintf("; one half-closed after a partial message (%s)", describe(err))
	}
	return "; one half-closed after a partial message"
}

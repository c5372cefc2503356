package tcptransport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// FuzzHello feeds the server what a stranger sends first. Whatever it is, readHello returns a
// token or an error, reads no more than a hello's bytes, and never panics.
func FuzzHello(f *testing.F) {
	var good bytes.Buffer
	writeHello(&good, "s3cret", laneSmall, [pairBytes]byte{1})
	f.Add(good.Bytes())
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	f.Add(append(append([]byte(nil), magic[:]...), version, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		token, err := readToken(r)
		read := len(data) - r.Len()
		if read > helloHead+maxTokenBytes {
			t.Fatalf("read %d bytes of a hello's token", read)
		}
		if err != nil {
			return
		}
		if read != helloHead+len(token) || !bytes.Equal(data[:len(magic)], magic[:]) {
			t.Fatalf("accepted a hello of %d bytes with a token of %d", read, len(token))
		}
		lane, _, err := readLane(r)
		if read := len(data) - r.Len(); read > helloHead+len(token)+helloTail {
			t.Fatalf("read %d bytes of a hello", read)
		}
		if err == nil && lane != laneSmall && lane != laneBulk {
			t.Fatalf("accepted lane %d", lane)
		}
	})
}

// FuzzRecords feeds a stream's reader what a peer that showed the token controls: every byte
// after the hello. Reading must end in frames or errors (malformed, or the end of the bytes),
// never a panic, and never allocate what a record only claims.
func FuzzRecords(f *testing.F) {
	var p wire.Parts
	for _, fr := range []*wire.Frame{
		{Kind: wire.FrameRequest, ID: 7, Method: "m", Payload: []byte("hello")},
		{Kind: wire.FrameChunk, ID: 7, Offset: 3, Payload: []byte("chunk")},
		{Kind: wire.FrameResponse, ID: 7, Buffers: [][]byte{[]byte("a"), nil}, Sizes: []int64{1, 2}},
	} {
		pieces, _, _ := p.Encode(fr)
		f.Add(append([]byte{0, 0, 0, 0}, record(bytes.Join(pieces, nil))...))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(record([]byte{0x9c, 0xcc, 1, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := makeStream(fuzzConn{bytes.NewReader(data)}, transport.PeerIdentity{}, nil)
		dst := make([]byte, 64)
		s.SetChunkSink(func(id uint64, offset int64, n int) ([]byte, bool) {
			if id != 7 || offset < 0 || offset > int64(len(dst)) || int64(n) > int64(len(dst))-offset {
				return nil, false
			}
			return dst[offset : offset+int64(n)], true
		})
		for range 1000 {
			f, err := s.Recv()
			if err != nil {
				if !errors.Is(err, transport.ErrMalformed) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("Recv failed with %v, want a malformed frame or the end of the bytes", err)
				}
				return
			}
			if recycle := f.TakeRecycle(); recycle != nil {
				recycle()
			}
		}
	})
}

// fuzzConn is a connection that reads the fuzzer's bytes and discards writes.
type fuzzConn struct{ *bytes.Reader }

func (fuzzConn) Write(p []byte) (int, error)      { return len(p), nil }
func (fuzzConn) Close() error                     { return nil }
func (fuzzConn) LocalAddr() net.Addr              { return nil }
func (fuzzConn) RemoteAddr() net.Addr             { return nil }
func (fuzzConn) SetDeadline(time.Time) error      { return nil }
func (fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (fuzzConn) SetWriteDeadline(time.Time) error { return nil }

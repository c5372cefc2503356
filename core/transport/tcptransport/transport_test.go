package tcptransport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// served is what a listening transport's serve function saw of one stream.
type served struct {
	stream transport.Stream
	done   chan struct{} // close to end the serve function
}

func listen(t *testing.T, tr *Transport) (string, chan served) {
	t.Helper()
	got := make(chan served, 16)
	addr, err := tr.Listen("127.0.0.1", func(s transport.Stream) {
		sv := served{stream: s, done: make(chan struct{})}
		got <- sv
		<-sv.done
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return addr, got
}

func newTransport(t *testing.T, token string) *Transport {
	t.Helper()
	tr, err := New(token, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func accepted(t *testing.T, got chan served) served {
	t.Helper()
	select {
	case sv := <-got:
		t.Cleanup(func() { close(sv.done) })
		return sv
	case <-time.After(5 * time.Second):
		t.Fatal("no stream was served")
		return served{}
	}
}

// connectedPair dials a listening transport of the world token and returns the dialed stream
// (closed when the test ends) and the accepted one.
func connectedPair(t *testing.T, token string) (transport.Stream, served) {
	t.Helper()
	addr, got := listen(t, newTransport(t, token))
	s, err := newTransport(t, token).Dial(ctxFor(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, accepted(t, got)
}

func TestFramesOfEverySizeCrossBothWays(t *testing.T) {
	s, sv := connectedPair(t, "tok")
	if id := sv.stream.(transport.IdentifiedStream).Identity(); !strings.HasPrefix(id.Addr, "127.0.0.1:") {
		t.Errorf("identity %+v, want the dialer's address", id)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: written with writev
	for _, f := range []*wire.Frame{
		{Kind: wire.FrameRequest, ID: 1, Method: "m", Payload: []byte("small")},
		{Kind: wire.FrameRequest, ID: 2, Method: "m", Payload: big[:coalesceBytes+1], Buffers: [][]byte{big[:5000], {}}},
		{Kind: wire.FrameResponse, ID: 3, Payload: big},
	} {
		for _, dir := range []struct{ from, to transport.Stream }{{s, sv.stream}, {sv.stream, s}} {
			if err := dir.from.Send(f); err != nil {
				t.Fatal(err)
			}
			g, err := dir.to.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if g.ID != f.ID || g.Method != f.Method || !bytes.Equal(g.Payload, f.Payload) || len(g.Buffers) != len(f.Buffers) {
				t.Fatalf("sent frame %d, got %d %q with a payload of %d bytes", f.ID, g.ID, g.Method, len(g.Payload))
			}
		}
	}
}

func TestChunksAreDecodedIntoTheSinksMemory(t *testing.T) {
	s, sv := connectedPair(t, "")
	dst := make([]byte, 100)
	sv.stream.(transport.SinkSetter).SetChunkSink(func(id uint64, offset int64, n int) ([]byte, bool) {
		return dst[offset : offset+int64(n)], id == 9
	})
	// An accepted stream's bulk lane is read once its hello (any first small frame) is.
	if err := s.Send(&wire.Frame{Kind: wire.FrameHello}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 9, Offset: 10, Payload: []byte("placed")}); err != nil {
		t.Fatal(err)
	}
	if f, err := sv.stream.Recv(); err != nil || f.Kind != wire.FrameHello {
		t.Fatalf("first frame %+v, %v; want the hello", f, err)
	}
	f, err := sv.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if n, placed := f.Placed(); !placed || n != 6 || string(dst[10:16]) != "placed" {
		t.Fatalf("placed %v, %d bytes; memory holds %q", placed, n, dst[10:16])
	}
}

// TestTheTokenIsCheckedBeforeAnythingElse: a dialer with the wrong token (or none) hears why
// from Dial, and the worker serves nothing of it.
func TestTheTokenIsCheckedBeforeAnythingElse(t *testing.T) {
	addr, got := listen(t, newTransport(t, "s3cret"))
	for _, token := range []string{"", "wrong", strings.Repeat("x", maxTokenBytes)} {
		_, err := newTransport(t, token).Dial(ctxFor(t), addr)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "TENSORPLAY_RPC_TOKEN") {
			t.Errorf("token %.10q: err = %v, want the worker's refusal", token, err)
		}
	}
	// Bytes that are no hello, then a frame: the connection is closed unanswered.
	for _, hello := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		append(append([]byte(nil), magic[:]...), 2, 0, 0),             // another version
		append(append([]byte(nil), magic[:]...), version, 0xff, 0xff), // a token too long
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(hello)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || errors.Is(err, errTimeout(err)) {
			t.Errorf("hello %q: got %d bytes, %v; want the connection closed", hello, n, err)
		}
		c.Close()
	}
	select {
	case <-got:
		t.Fatal("a stream without the token was served")
	default:
	}
}

func errTimeout(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return errors.New("not a timeout")
}

// TestStrangersCannotHoldTheServer: a connection that shows nothing is dropped after the
// handshake timeout, and a flood of them cannot keep an honest dialer out.
func TestStrangersCannotHoldTheServer(t *testing.T) {
	tr := newTransport(t, "")
	tr.handshakeTimeout = 300 * time.Millisecond
	addr, _ := listen(t, tr)
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a silent connection: %v, want it closed by the server", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a silent connection lived %s, want about the handshake timeout", d)
	}

	tr = newTransport(t, "")
	tr.handshakeTimeout = time.Minute
	addr, got := listen(t, tr)
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 3 * maxHandshakes {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
	}
	s, err := newTransport(t, "").Dial(ctxFor(t), addr)
	if err != nil {
		t.Fatalf("an honest dialer after %d silent connections: %v", len(flood), err)
	}
	s.Close()
	accepted(t, got)
	tr.mu.Lock()
	held := len(tr.pending)
	tr.mu.Unlock()
	if held > maxHandshakes {
		t.Errorf("the server holds %d connections in their handshake, want at most %d", held, maxHandshakes)
	}
}

// rawPeer dials both lanes of a stream to addr and says their hellos; it returns the small
// lane's connection, which is then whatever the test makes of it.
func rawPeer(t *testing.T, addr string) net.Conn {
	t.Helper()
	pair := [pairBytes]byte{byte(time.Now().UnixNano())}
	var small net.Conn
	for _, lane := range []byte{laneSmall, laneBulk} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := writeHello(c, "", lane, pair); err != nil {
			t.Fatal(err)
		}
		if err := readAnswer(c); err != nil {
			t.Fatal(err)
		}
		if small == nil {
			small = c
		}
	}
	return small
}

func record(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
}

func TestMalformedRecordsEndTheStreamNamingWhy(t *testing.T) {
	var p wire.Parts
	pieces, _, _ := p.Encode(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "m"})
	good := bytes.Join(pieces, nil)
	for _, tt := range []struct {
		name, bytes, want string
	}{
		{"over the limit", string(binary.BigEndian.AppendUint32(nil, maxRecord+1)), "more than"},
		{"not msgpack", string(record([]byte{0xc1, 0xc1})), "msgpack"},
		{"a frame shorter than its record", string(record(append(append([]byte(nil), good...), 0, 0))), "ends 2 bytes before its record"},
		{"a frame longer than its record", string(record(good[:len(good)-1])), "EOF"},
	} {
		tr := newTransport(t, "")
		addr, got := listen(t, tr)
		c := rawPeer(t, addr)
		sv := accepted(t, got)
		c.Write([]byte(tt.bytes))
		_, err := sv.stream.Recv()
		if !errors.Is(err, transport.ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Recv = %v, want a malformed frame saying %q", tt.name, err, tt.want)
		}
	}
}

// TestAPeerThatFallsSilentIsLost: a peer that says nothing, not even heartbeats, while this
// side waits to read loses its stream within about the peer timeout; one that stays silent
// while this side does not read keeps it; heartbeats keep an idle stream alive.
func TestAPeerThatFallsSilentIsLost(t *testing.T) {
	const peerTimeout = 400 * time.Millisecond
	tr := newTransport(t, "")
	tr.SetPeerTimeout(peerTimeout)
	addr, got := listen(t, tr)

	// Two honest ends idle for several peer timeouts: heartbeats keep them.
	dialer := newTransport(t, "")
	dialer.SetPeerTimeout(peerTimeout)
	s, err := dialer.Dial(ctxFor(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	honest := accepted(t, got)
	recvd := make(chan error, 1)
	go func() { _, err := honest.stream.Recv(); recvd <- err }()
	time.Sleep(4 * peerTimeout)
	if err := s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1}); err != nil {
		t.Fatalf("an idle stream with heartbeats: %v", err)
	}
	if err := <-recvd; err != nil {
		t.Fatalf("an idle stream with heartbeats: %v", err)
	}

	// A peer that says nothing more, while nobody reads: kept.
	rawPeer(t, addr)
	quiet := accepted(t, got)
	time.Sleep(3 * peerTimeout)
	// Now waited for: lost within the peer timeout and a beat or two.
	start := time.Now()
	_, err = quiet.stream.Recv()
	if !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("Recv from a silent peer = %v, want %v", err, ErrPeerSilent)
	}
	if d := time.Since(start); d < peerTimeout/2 || d > 3*peerTimeout {
		t.Errorf("a silent peer was lost after %s, want about the peer timeout (%s)", d, peerTimeout)
	}
	if err := quiet.stream.Send(&wire.Frame{Kind: wire.FrameRequest}); !errors.Is(err, ErrPeerSilent) {
		t.Errorf("Send after the peer was lost = %v, want the same reason", err)
	}
}

// TestAClosedPeerFailsReadsAndWritesAtOnce: the peer's end closes, and this end hears it.
func TestAClosedPeerFailsReadsAndWritesAtOnce(t *testing.T) {
	s, sv := connectedPair(t, "")
	s.Close()
	if _, err := sv.stream.Recv(); err == nil || !strings.Contains(err.Error(), "closed the connection") {
		t.Errorf("Recv after the dialer closed = %v", err)
	}
	if _, err := s.Recv(); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Recv of a stream closed here = %v, want %v", err, transport.ErrClosed)
	}
}

// TestStopListeningEndsAcceptedStreamsAndRefusesNewOnes: what a worker shutting down does
// first, so a peer that probes it finds it gone.
func TestStopListeningEndsAcceptedStreamsAndRefusesNewOnes(t *testing.T) {
	tr := newTransport(t, "")
	addr, got := listen(t, tr)
	s, err := newTransport(t, "").Dial(ctxFor(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sv := accepted(t, got)
	tr.StopListening()
	if _, err := sv.stream.Recv(); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("an accepted stream after StopListening: %v", err)
	}
	if _, err := s.Recv(); err == nil {
		t.Error("the dialer's end of a stream the worker ended still reads")
	}
	if err := newTransport(t, "").Probe(ctxFor(t), addr); !errors.Is(err, transport.ErrGone) {
		t.Errorf("Probe after StopListening = %v, want %v", err, transport.ErrGone)
	}
}

// TestASmallFrameIsNotQueuedBehindABigMessage: with 64 MiB of a big message's chunks on their
// way (more than the sockets' buffers hold), a small frame sent after them is among the first
// frames the receiver reads: the lanes are two connections, so it waits for none of them.
func TestASmallFrameIsNotQueuedBehindABigMessage(t *testing.T) {
	s, sv := connectedPair(t, "")
	sv.stream.(transport.SinkSetter).SetChunkSink(func(uint64, int64, int) ([]byte, bool) { return nil, true })
	if err := s.Send(&wire.Frame{Kind: wire.FrameHello}); err != nil {
		t.Fatal(err)
	}
	if _, err := sv.stream.Recv(); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	sent := make(chan error, 1)
	go func() {
		for i := range 64 {
			if err := s.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: int64(i) << 20, Payload: chunk}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(100 * time.Millisecond) // the chunks fill the buffers
	if err := s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 2, Method: "small"}); err != nil {
		t.Fatal(err)
	}
	for n := 0; ; n++ {
		f, err := sv.stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == wire.FrameRequest {
			if n > 8 {
				t.Fatalf("the small frame came after %d chunks sent before it", n)
			}
			break
		}
		time.Sleep(time.Millisecond) // a receiver slow to take big messages
	}
	for range 64 { // the rest, so the sender ends
		if _, err := sv.stream.Recv(); err != nil {
			break
		}
		if len(sent) > 0 {
			break
		}
	}
}

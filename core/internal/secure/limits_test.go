package secure

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// limitedServer serves, with the world's server options, a stream method that answers the
// first message of each stream and then holds the stream until the test ends.
func limitedServer(t *testing.T, sec World) (addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	srv := grpc.NewServer(sec.ServerOptions()...)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.Limits",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Hold", ServerStreams: true, ClientStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			var f wire.Frame
			if err := ss.RecvMsg(&f); err != nil {
				return err
			}
			if err := ss.SendMsg(&f); err != nil {
				return err
			}
			select {
			case <-done:
			case <-ss.Context().Done():
			}
			return nil
		}}},
	}, struct{}{})
	go srv.Serve(lis)
	t.Cleanup(func() { close(done); srv.Stop() })
	return lis.Addr().String()
}

// holdStream opens a stream on cc and waits for its first answer.
func holdStream(ctx context.Context, cc *grpc.ClientConn) error {
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.Limits/Hold")
	if err != nil {
		return err
	}
	f := &wire.Frame{Kind: wire.FrameRequest, ID: 1}
	if err := s.SendMsg(f); err != nil {
		return err
	}
	return s.RecvMsg(&wire.Frame{})
}

// TestAConnectionHoldsAtMostItsStreamsAndHeaders: whoever connects, with the token or not, one
// connection holds at most maxStreamsPerConn streams at once and sends at most maxHeaderBytes
// of headers a stream.
func TestAConnectionHoldsAtMostItsStreamsAndHeaders(t *testing.T) {
	sec, err := New("", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := limitedServer(t, sec)
	cc, err := grpc.NewClient("passthrough:///"+addr, sec.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range maxStreamsPerConn {
		if err := holdStream(ctx, cc); err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, maxStreamsPerConn, err)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	if err := holdStream(short, cc); err == nil {
		t.Fatalf("a connection opened stream %d while %d were open", maxStreamsPerConn+1, maxStreamsPerConn)
	}

	other, err := grpc.NewClient("passthrough:///"+addr, sec.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	fits := metadata.AppendToOutgoingContext(ctx, "x-fits", strings.Repeat("a", maxHeaderBytes/2))
	if err := holdStream(fits, other); err != nil {
		t.Fatalf("a stream with %d bytes of headers: %v", maxHeaderBytes/2, err)
	}
	tooBig := metadata.AppendToOutgoingContext(ctx, "x-too-big", strings.Repeat("a", 2*maxHeaderBytes))
	if err := holdStream(tooBig, other); err == nil {
		t.Fatalf("a stream with %d bytes of headers was served (the limit is %d)", 2*maxHeaderBytes, maxHeaderBytes)
	}
}

// TestAConnectionThatNeverSpeaksIsDropped: a connection that never finishes the handshake is
// closed after handshakeTimeout, holding nothing on the server longer.
func TestAConnectionThatNeverSpeaksIsDropped(t *testing.T) {
	t.Parallel()
	sec, err := New("", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := limitedServer(t, sec)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	conn.SetReadDeadline(start.Add(handshakeTimeout + 5*time.Second))
	var buf [4096]byte
	for {
		_, err := conn.Read(buf[:]) // the server's settings, then its end
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) || strings.Contains(err.Error(), "reset") {
			break
		}
		t.Fatalf("a silent connection was still open after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if took := time.Since(start); took < handshakeTimeout/2 {
		t.Fatalf("a silent connection was dropped after %v, before the handshake timeout %v", took, handshakeTimeout)
	}
}

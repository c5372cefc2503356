package faults

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/grpctransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestHostileBytes sends what a stranger or a broken peer might to a worker's and the store's
// ports: the agent must drop it without a panic and keep serving.
func TestHostileBytes(t *testing.T) {
	cfgs := coretest.Configs(t, 2, coretest.Options{GRPC: true, Handlers: echo})
	w1Log := newLogRecorder()
	cfgs[1].Logger = w1Log.logger()
	storeAddr := strings.TrimPrefix(cfgs[0].InitMethod, "tcp://")
	agents := coretest.Start(t, cfgs).Agents
	worker := coretest.NetworkAddr(agents[1])
	noise := make([]byte, 64<<10)
	rand.Read(noise)
	http2Preface := "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	attacks := []struct {
		name string
		data []byte
	}{
		{name: "random bytes", data: noise},
		{name: "truncated preface", data: []byte(http2Preface[:10])},
		{name: "preface then garbage", data: append([]byte(http2Preface), noise[:4096]...)},
		// An HTTP/2 DATA frame header announcing 16 MiB on a stream never opened.
		{name: "absurd frame size", data: append([]byte(http2Preface), 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01)},
		{name: "half-open", data: nil},
	}
	var open []net.Conn
	defer func() {
		for _, conn := range open {
			conn.Close()
		}
	}()
	for _, addr := range []string{worker, storeAddr} {
		for _, a := range attacks {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				t.Fatalf("%s: %v", a.name, err)
			}
			if a.data != nil {
				conn.SetWriteDeadline(time.Now().Add(time.Second))
				conn.Write(a.data)
			}
			open = append(open, conn) // left open: half-open and unfinished connections too
		}
	}
	// A peer that speaks the protocol: a message over the limit fails that call only (its
	// chunks would be dropped); frames no honest peer sends end that peer's stream. Nothing
	// is allocated by what a frame claims, and the worker keeps serving.
	tr, worker, err := coretest.NetworkTransport(agents[1], "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range protocolAttacks() {
		s, err := tr.Dial(ctx, worker)
		if err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
		resp, err := attack(ctx, s, a.frames)
		switch {
		case a.dropped == "":
			if err != nil || resp.Status != wire.ReplyTooLarge || !strings.Contains(resp.Error, "limit") {
				t.Errorf("%s: got %+v, %v; want the call refused as over the limit", a.name, resp, err)
			}
		case err == nil:
			t.Errorf("%s: the worker answered (%+v) instead of ending the stream", a.name, resp)
		case a.decoded != "":
			// gRPC tells the caller why the worker ended the stream: each lane ends, the one
			// whose frame failed to decode with why. Plain TCP only closes the connection.
			why := err.Error()
			if _, err := s.Recv(); err != nil {
				why += "; " + err.Error()
			}
			if _, isGRPC := tr.(*grpctransport.Transport); isGRPC && !strings.Contains(why, a.decoded) {
				t.Errorf("%s: the stream ended with %q; want it to say %q", a.name, why, a.decoded)
			}
			w1Log.wait(t, "dropped a caller that broke the protocol", a.decoded)
		default:
			w1Log.wait(t, "dropped a caller that broke the protocol", "protocol violation: "+a.dropped)
		}
		s.Close()
		for i := 0; i < 3; i++ {
			resp, err := agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("still here")})
			if err != nil || string(resp.Payload) != "still here" {
				t.Fatalf("after %s the worker stopped serving: %q, %v", a.name, resp.Payload, err)
			}
		}
	}
}

// TestProtocolViolationsAreRefusedForTheirReason: on a transport that hands the worker every
// frame as it came, each frame no honest peer sends ends its stream, and the worker logs which
// rule it broke.
func TestProtocolViolationsAreRefusedForTheirReason(t *testing.T) {
	network := transport.NewInmemNetwork()
	cfgs := coretest.Configs(t, 2, coretest.Options{Handlers: echo, Network: network})
	w1Log := newLogRecorder()
	cfgs[1].Logger = w1Log.logger()
	agents := coretest.Start(t, cfgs).Agents
	// A transport listening nowhere: its streams come from no address, so it may speak as w0.
	stranger := network.Transport()
	defer stranger.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range protocolAttacks() {
		s, err := stranger.Dial(ctx, agents[1].Self().Addr)
		if err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
		resp, err := attack(ctx, s, a.frames)
		if a.dropped == "" {
			if err != nil || resp.Status != wire.ReplyTooLarge || !strings.Contains(resp.Error, "limit") {
				t.Errorf("%s: got %+v, %v; want the call refused as over the limit", a.name, resp, err)
			}
		} else {
			if !errors.Is(err, transport.ErrClosed) {
				t.Errorf("%s: got %+v, %v; want the worker to end the stream", a.name, resp, err)
			}
			w1Log.wait(t, "dropped a caller that broke the protocol", "protocol violation: "+a.dropped)
		}
		s.Close()
		if resp, err := agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("still here")}); err != nil || string(resp.Payload) != "still here" {
			t.Fatalf("after %s the worker stopped serving: %q, %v", a.name, resp.Payload, err)
		}
	}
}

// protocolAttack is frames a peer that speaks the protocol may send to break it.
type protocolAttack struct {
	name   string
	frames []*wire.Frame
	// dropped is why the worker ends the stream, as it logs it; "" if it refuses the call as
	// over its limit instead.
	dropped string
	// decoded, if set, is why gRPC's decoder refuses the frame, before the worker sees it (it
	// knows where every chunk may go); gRPC tells the caller.
	decoded string
}

// protocolAttacks returns the attacks, their frames new at every call: the in-memory
// transport hands the worker the frames themselves, and it may change them.
func protocolAttacks() []protocolAttack {
	return []protocolAttack{
		{name: "a petabyte announced", frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{1 << 50}}}},
		{name: "sizes whose sum wraps", frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{1, math.MaxInt64, math.MaxInt64, 2}},
			{Kind: wire.FrameChunk, ID: 1, Payload: []byte{1}}}},
		{name: "a chunk at an offset near the end of int64",
			dropped: "chunk of message 1 at 9223372036854775805+4 lies outside its 64 bytes",
			decoded: "chunk of message 1 at 9223372036854775805+4 does not fit a message being received",
			frames: []*wire.Frame{
				{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{64}},
				{Kind: wire.FrameChunk, ID: 1, Offset: math.MaxInt64 - 2, Payload: []byte{1, 2, 3, 4}}}},
		{name: "a negative size", dropped: "message 1 announces a negative size", frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{8, -4}}}},
		{name: "a chunk of a message never announced",
			dropped: "chunk of unknown message 9",
			decoded: "chunk of message 9 at 0+1 does not fit a message being received",
			frames: []*wire.Frame{
				{Kind: wire.FrameChunk, ID: 9, Payload: []byte{1}}}},
	}
}

// attack opens s as w0, shows that it is served (a call is answered), sends frames and
// returns what comes back. s is closed when ctx ends, so no Recv on it waits longer.
func attack(ctx context.Context, s transport.Stream, frames []*wire.Frame) (*wire.Frame, error) {
	context.AfterFunc(ctx, func() { s.Close() })
	s.Send(wire.HelloFrame("w0", 0, 0))
	s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 100, Method: "echo", Payload: []byte("before")})
	resp, err := s.Recv()
	if err != nil || resp.ID != 100 || string(resp.Payload) != "before" {
		return resp, fmt.Errorf("the stream was not served before the attack: %+v, %w", resp, err)
	}
	for _, f := range frames {
		s.Send(f)
	}
	return s.Recv()
}

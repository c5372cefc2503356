package faults

import (
	"context"
	"crypto/rand"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport/grpctransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestHostileBytes sends what a stranger or a broken peer might to a worker's and the store's
// ports: the agent must drop it without a panic and keep serving.
func TestHostileBytes(t *testing.T) {
	cfgs := coretest.Configs(t, 2, coretest.Options{GRPC: true, Handlers: echo})
	storeAddr := strings.TrimPrefix(cfgs[0].InitMethod, "tcp://")
	agents := coretest.Start(t, cfgs).Agents
	worker := coretest.GRPCAddr(agents[1])
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
	tr, _ := grpctransport.New("", nil)
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type outcome int
	const (
		refusedTooLarge outcome = iota
		streamDropped
	)
	protocolAttacks := []struct {
		name   string
		frames []*wire.Frame
		want   outcome
	}{
		{name: "a petabyte announced", want: refusedTooLarge, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{1 << 50}}}},
		{name: "sizes whose sum wraps", want: refusedTooLarge, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{1, math.MaxInt64, math.MaxInt64, 2}},
			{Kind: wire.FrameChunk, ID: 1, Payload: []byte{1}}}},
		{name: "a chunk at an offset near the end of int64", want: streamDropped, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{64}},
			{Kind: wire.FrameChunk, ID: 1, Offset: math.MaxInt64 - 2, Payload: []byte{1, 2, 3, 4}}}},
		{name: "a negative size", want: streamDropped, frames: []*wire.Frame{
			{Kind: wire.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{8, -4}}}},
		{name: "a chunk of a message never announced", want: streamDropped, frames: []*wire.Frame{
			{Kind: wire.FrameChunk, ID: 9, Payload: []byte{1}}}},
	}
	for _, a := range protocolAttacks {
		s, err := tr.Dial(ctx, worker)
		if err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
		s.Send(wire.HelloFrame("w0", 0, 0))
		for _, f := range a.frames {
			s.Send(f)
		}
		resp, err := s.Recv()
		switch a.want {
		case refusedTooLarge:
			if err != nil || resp.Status != wire.ReplyTooLarge || !strings.Contains(resp.Error, "limit") {
				t.Errorf("%s: got %+v, %v; want the call refused as over the limit", a.name, resp, err)
			}
		case streamDropped:
			if err == nil {
				t.Errorf("%s: the worker answered (%+v) instead of dropping the stream", a.name, resp)
			}
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

package faults

import (
	"context"
	"crypto/rand"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

// TestHostileBytes sends what a stranger or a broken peer might to a worker's and the store's
// ports: the agent must drop it without a panic and keep serving.
func TestHostileBytes(t *testing.T) {
	cfgs := coretest.Configs(t, 2, coretest.Options{GRPC: true, Handlers: echo})
	storeAddr := strings.TrimPrefix(cfgs[0].InitMethod, "tcp://")
	agents := coretest.Start(t, cfgs).Agents
	worker := agents[1].Self().Addr
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
	// A peer speaking the protocol but announcing a message far over the limit is refused
	// before anything is allocated, and only its own stream is dropped.
	tr, _ := core.NewGRPCTransport("", nil)
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := tr.Dial(ctx, worker)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&core.Frame{Kind: core.FrameHello, Method: "w0", CallerID: 0})
	s.Send(&core.Frame{Kind: core.FrameRequest, ID: 1, Method: "echo", Sizes: []int64{1 << 50}})
	if _, err := s.Recv(); err == nil {
		t.Fatal("the worker answered a request announcing a petabyte")
	}
	for i := 0; i < 3; i++ {
		resp, err := agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("still here")})
		if err != nil || string(resp.Payload) != "still here" {
			t.Fatalf("the worker stopped serving: %q, %v", resp.Payload, err)
		}
	}
}

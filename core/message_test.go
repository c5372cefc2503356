package core_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
)

// A request of one frame with a long payload is decoded into pooled memory: it is not lent in
// place (its segments are not in one buffer), and Release gives the memory back, once.
func TestALongRequestOfOneFrameGoesBackToThePool(t *testing.T) {
	for _, transport := range []string{core.TransportSHM, core.TransportGRPC} {
		t.Run(transport, func(t *testing.T) {
			type seen struct {
				pooled, intact bool
				back, again    int
			}
			got := make(chan seen, 1)
			payload := bytes.Repeat([]byte{7}, 100<<10) // 128 KiB of pooled memory
			handlers := map[string]core.Handler{"keep": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
				s := seen{pooled: req.Pooled(), intact: bytes.Equal(req.Payload, payload)}
				before := bufpool.Shared.Idle()
				req.Release()
				s.back = bufpool.Shared.Idle() - before
				req.Release()
				s.again = bufpool.Shared.Idle() - before
				got <- s
				return core.Message{Payload: []byte("ok")}, nil
			})}
			c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{transport}, Handlers: handlers})
			if _, err := c.Agents[0].Call(testctx.For(t), "w1", "keep", core.Message{Payload: payload}); err != nil {
				t.Fatal(err)
			}
			s := <-got
			if s.pooled || !s.intact || s.back != 128<<10 || s.again != s.back {
				t.Fatalf("pooled (lent in place) %v, payload intact %v, released %d bytes, %d after a second Release; want false, true, %d, %d", s.pooled, s.intact, s.back, s.again, 128<<10, 128<<10)
			}
		})
	}
}

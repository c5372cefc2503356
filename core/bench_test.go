package core_test

import (
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

func BenchmarkCall(b *testing.B) {
	for _, grpc := range []bool{false, true} {
		b.Run(map[bool]string{false: "inmem", true: "grpc"}[grpc], func(b *testing.B) {
			c := coretest.New(b, 2, coretest.Options{GRPC: grpc, Handlers: testHandlers(nil)})
			req := core.Message{Payload: make([]byte, 64)}
			ctx := testctx.For(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Agents[0].Call(ctx, "w1", "echo", req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

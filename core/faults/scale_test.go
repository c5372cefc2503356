package faults

import (
	"context"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

// TestLargeWorldForms: a world of 64 workers forms and shuts down gracefully within seconds
// (torch's agent is known to stall past a few dozen).
func TestLargeWorldForms(t *testing.T) {
	start := time.Now()
	c := coretest.New(t, 64, coretest.Options{GRPC: true, Handlers: echo})
	formed := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, len(c.Agents))
	for _, a := range c.Agents {
		go func() { done <- a.Shutdown(ctx, true) }()
	}
	for range c.Agents {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("64 workers: formed in %v, shut down in %v", formed, time.Since(start)-formed)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("a world of 64 took %v", took)
	}
}

package faults

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// A stream whose hello cannot be sent fails the call as a lost peer, naming the worker.
func TestAFailedHelloFailsTheCallNamingTheWorker(t *testing.T) {
	cfgs := coretest.Configs(t, 2, coretest.Options{Handlers: echo})
	// Every send fails, as one to a worker that is leaving does (the shared-memory wake-up
	// hits a closed socket).
	cfgs[0].Transport = coretest.SendHooked(cfgs[0].Transport, func(*wire.Frame) error { return errors.New("write: broken pipe") })
	c := coretest.Start(t, cfgs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("hi")})
	if !errors.Is(err, core.ErrPeerLost) || !strings.Contains(err.Error(), `"w1"`) || !strings.Contains(err.Error(), "broken pipe") {
		t.Fatalf("err %v, want ErrPeerLost naming w1 and the cause", err)
	}
}

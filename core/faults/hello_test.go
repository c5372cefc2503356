package faults

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// mutedTransport opens streams whose every Send fails, as one to a worker that is leaving
// does (the shared-memory wake-up hits a closed socket).
type mutedTransport struct{ transport.Transport }

func (t mutedTransport) Dial(ctx context.Context, addr string) (transport.Stream, error) {
	s, err := t.Transport.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return mutedStream{s}, nil
}

type mutedStream struct{ transport.Stream }

func (mutedStream) Send(*wire.Frame) error { return errors.New("write: broken pipe") }

// A stream whose hello cannot be sent fails the call as a lost peer, naming the worker.
func TestAFailedHelloFailsTheCallNamingTheWorker(t *testing.T) {
	cfgs := coretest.Configs(t, 2, coretest.Options{Handlers: echo})
	cfgs[0].Transport = mutedTransport{cfgs[0].Transport}
	c := coretest.Start(t, cfgs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Agents[0].Call(ctx, "w1", "echo", core.Message{Payload: []byte("hi")})
	if !errors.Is(err, core.ErrPeerLost) || !strings.Contains(err.Error(), `"w1"`) || !strings.Contains(err.Error(), "broken pipe") {
		t.Fatalf("err %v, want ErrPeerLost naming w1 and the cause", err)
	}
}

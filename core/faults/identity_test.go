package faults

import (
	"context"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/grpctransport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/shmtransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestAPeerCanOnlyActAsItself: a stream's hello must name a worker registered at the host it
// comes from, and a worker can release only the RRef forks it holds itself, so a peer cannot
// make an owner drop a value another worker still uses.
func TestAPeerCanOnlyActAsItself(t *testing.T) {
	dropped := make(chan wire.RRefID, 1)
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, Handlers: echo})
	cfgs[0].OnRRefDropped = func(id wire.RRefID) { dropped <- id }
	c := coretest.Start(t, cfgs)
	owner, holder := c.Agents[0], c.Agents[1]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rref, fork := holder.NewRRefID(), holder.NewRRefID()
	if err := holder.AddFork(ctx, 0, rref, fork, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Call(ctx, "w0", "echo", core.Message{}); err != nil {
		t.Fatal(err) // the fork is registered once this call, sent after it, is answered
	}
	var seq uint64 // numbered as the stream's sender's operations, so they reach the checks
	forged := func(holder int) *wire.Frame {
		seq++
		return &wire.Frame{Kind: wire.FrameRefs, Refs: []wire.RefOp{{Kind: wire.RefRelease, RRef: rref, Fork: fork, Holder: holder}}, RefSeq: seq}
	}

	// From another address (127.0.0.2 is loopback too), claiming to be w1: refused at hello.
	elsewhere, _ := grpctransport.New("", nil)
	defer elsewhere.Close()
	if _, err := elsewhere.Listen("127.0.0.2", func(transport.Stream) {}); err != nil {
		t.Fatal(err)
	}
	s, err := elsewhere.Dial(ctx, coretest.GRPCAddr(owner))
	if err != nil {
		t.Fatal(err)
	}
	s.Send(wire.HelloFrame("w1", 1, 0))
	s.Send(forged(1))
	s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "echo"})
	if resp, err := s.Recv(); err == nil {
		t.Fatalf("a stream from 127.0.0.2 posing as w1 (registered at %s) was served: %+v", holder.Self().Addr, resp)
	}

	// From the right host as w2: its releases of w1's fork, in w1's name or its own, are
	// refused. The echo after them answers once they were applied.
	local, _ := grpctransport.New("", nil)
	defer local.Close()
	s, err = local.Dial(ctx, coretest.GRPCAddr(owner))
	if err != nil {
		t.Fatal(err)
	}
	s.Send(wire.HelloFrame("w2", 2, 0))
	s.Send(forged(1))
	s.Send(forged(2))
	s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "echo"})
	if resp, err := s.Recv(); err != nil || resp.Status != wire.ReplyOK {
		t.Fatalf("the honest-looking stream was not served: %+v, %v", resp, err)
	}
	if owner.OwnedRRefs() != 1 {
		t.Fatal("the owner dropped a value its holder still uses, on a forged release")
	}
	select {
	case id := <-dropped:
		t.Fatalf("the owner dropped %v on a forged release", id)
	default:
	}

	// The holder's own release still works.
	if err := holder.ReleaseFork(0, rref, fork); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-dropped:
		if id != rref {
			t.Fatalf("dropped %v, want %v", id, rref)
		}
	case <-ctx.Done():
		t.Fatal("the holder's own release did not drop the value")
	}
}

// TestAPeerOnThisHostCanOnlyActAsAWorkerOfThisHost: a shared-memory stream comes from this
// host, so its hello must name a worker that registered a shared-memory address here.
func TestAPeerOnThisHostCanOnlyActAsAWorkerOfThisHost(t *testing.T) {
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, Handlers: echo})
	cfgs[0].Transports = core.DefaultTransports // whatever TENSORPLAY_RPC_TRANSPORTS says
	cfgs[1].Transports = core.DefaultTransports
	cfgs[2].Transports = []string{core.TransportGRPC} // as if on another host: no shm address
	c := coretest.Start(t, cfgs)
	addr := coretest.SHMAddr(c.Agents[0])
	if addr == "" {
		t.Fatalf("w0 registered no shared-memory address: %s", c.Agents[0].Self().Addr)
	}
	cases := []struct {
		claim  string
		rank   int
		served bool
	}{
		{"w1", 1, true},  // registered a shared-memory address here
		{"w2", 2, false}, // did not: a local process cannot pass for it
	}
	for _, tc := range cases {
		t.Run(tc.claim, func(t *testing.T) {
			tr, err := shmtransport.New("", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := tr.Dial(ctx, addr)
			if err != nil {
				t.Fatal(err)
			}
			s.Send(wire.HelloFrame(tc.claim, tc.rank, 0))
			s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "echo"})
			resp, err := s.Recv()
			if served := err == nil && resp.Status == wire.ReplyOK; served != tc.served {
				t.Fatalf("a shared-memory stream claiming %s: served %v (%+v, %v), want %v", tc.claim, served, resp, err, tc.served)
			}
		})
	}
}

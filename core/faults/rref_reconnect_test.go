package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// lossyTransport wraps the streams a worker dials so a test can make them lose frames, one
// way or the other, and then break, as a link that fails mid-stream does.
type lossyTransport struct {
	transport.Transport
	mu      sync.Mutex
	streams []*lossyStream
}

func (t *lossyTransport) Dial(ctx context.Context, addr string) (transport.Stream, error) {
	s, err := t.Transport.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	ls := &lossyStream{Stream: s}
	t.mu.Lock()
	t.streams = append(t.streams, ls)
	t.mu.Unlock()
	return ls, nil
}

// lose makes every stream dialed so far drop what it sends (out) or receives (back).
func (t *lossyTransport) lose(out, back bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.streams {
		s.dropSends.Store(out)
		s.dropRecvs.Store(back)
	}
}

// breakAll ends every stream dialed so far.
func (t *lossyTransport) breakAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.streams {
		s.Close()
	}
	t.streams = nil
}

type lossyStream struct {
	transport.Stream
	dropSends, dropRecvs atomic.Bool
}

func (s *lossyStream) Send(f *wire.Frame) error {
	if s.dropSends.Load() {
		return nil
	}
	return s.Stream.Send(f)
}

func (s *lossyStream) Recv() (*wire.Frame, error) {
	for {
		f, err := s.Stream.Recv()
		if err != nil || !s.dropRecvs.Load() {
			return f, err
		}
	}
}

// TestReferenceOperationsSurviveABrokenStream: reference operations lost with a stream that
// broke are sent again on the next one, and ones that arrived but whose acknowledgement was
// lost are not applied twice. Before, a fork's registration lost with the stream let the
// owner free a value the holder still used once its other fork was released, and an operation
// applied twice (a release) left the value held forever.
func TestReferenceOperationsSurviveABrokenStream(t *testing.T) {
	tests := []struct {
		name            string
		loseOut, loseIn bool
	}{
		{name: "operations lost on the way", loseOut: true},
		{name: "acknowledgements lost on the way back", loseIn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfgs := coretest.Configs(t, 2, coretest.Options{Handlers: echo})
			lossy := &lossyTransport{Transport: cfgs[0].Transport}
			cfgs[0].Transport = lossy
			c := coretest.Start(t, cfgs)
			holder, owner := c.Agents[0], c.Agents[1]
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			call := func() {
				t.Helper()
				if _, err := holder.Call(ctx, "w1", "echo", core.Message{}); err != nil {
					t.Fatal(err)
				}
			}
			rref, first, second := holder.NewRRefID(), holder.NewRRefID(), holder.NewRRefID()
			if err := holder.AddFork(ctx, 1, rref, first, 0); err != nil {
				t.Fatal(err)
			}
			call() // the first fork is registered once this call, which carried it, is answered

			lossy.lose(tt.loseOut, tt.loseIn)
			if err := holder.AddFork(ctx, 1, rref, second, 0); err != nil {
				t.Fatal(err)
			}
			if err := holder.ReleaseFork(1, rref, first); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // the flush timer sends both
			lossy.breakAll()
			// The next call goes on a new stream once the holder has seen the old one end.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				_, err := holder.Call(ctx, "w1", "echo", core.Message{})
				if err == nil {
					break
				}
				if !errors.Is(err, core.ErrPeerLost) || time.Now().After(deadline) {
					t.Fatal(err)
				}
			}

			if n := owner.OwnedRRefs(); n != 1 {
				t.Fatalf("owner keeps %d RRefs while the holder holds the second fork, want 1", n)
			}
			if err := holder.ReleaseFork(1, rref, second); err != nil {
				t.Fatal(err)
			}
			call()
			if n := owner.OwnedRRefs(); n != 0 {
				t.Fatalf("owner keeps %d RRefs after every fork was released, want 0", n)
			}
		})
	}
}

// heldFork starts a holder (w0, whose dialed streams can be made lossy) and an owner (w1, its
// transport wrapped by wrapOwner), and registers a fork of an RRef w1 owns, held by w0; it
// returns once w1 has it.
func heldFork(t *testing.T, wrapOwner func(transport.Transport) transport.Transport) (holder, owner *core.Agent, lossy *lossyTransport, rref, fork wire.RRefID) {
	t.Helper()
	cfgs := coretest.Configs(t, 2, coretest.Options{Handlers: echo})
	lossy = &lossyTransport{Transport: cfgs[0].Transport}
	cfgs[0].Transport = lossy
	cfgs[1].Transport = wrapOwner(cfgs[1].Transport)
	c := coretest.Start(t, cfgs)
	holder, owner = c.Agents[0], c.Agents[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rref, fork = holder.NewRRefID(), holder.NewRRefID()
	if err := holder.AddFork(ctx, 1, rref, fork, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Call(ctx, "w1", "echo", core.Message{}); err != nil {
		t.Fatal(err) // the fork is registered once this call, which carried it, is answered
	}
	return holder, owner, lossy, rref, fork
}

// holderSeenFromOwner stands between an owner and one holder's address: while on, dials
// to it fail with dialErr and probes answer what probe says, whatever the holder itself does.
type holderSeenFromOwner struct {
	transport.Transport
	addr    string
	dialErr error
	probe   func() error // nil: the host takes connections
	on      atomic.Bool  // set after the fields above, so they are read only once set
}

func (t *holderSeenFromOwner) Dial(ctx context.Context, addr string) (transport.Stream, error) {
	if t.on.Load() && addr == t.addr {
		return nil, t.dialErr
	}
	return t.Transport.Dial(ctx, addr)
}

func (t *holderSeenFromOwner) Probe(ctx context.Context, addr string) error {
	if t.on.Load() && addr == t.addr {
		return t.probe()
	}
	return t.Transport.(transport.Prober).Probe(ctx, addr)
}

// ownerView starts heldFork with the owner's view of the holder in between.
func ownerView(t *testing.T) (view *holderSeenFromOwner, holder, owner *core.Agent, lossy *lossyTransport, rref, fork wire.RRefID) {
	view = &holderSeenFromOwner{}
	holder, owner, lossy, rref, fork = heldFork(t, func(tr transport.Transport) transport.Transport {
		view.Transport = tr
		return view
	})
	view.addr = holder.Self().Addr
	return view, holder, owner, lossy, rref, fork
}

// TestAWorkerCutOffForAWhileKeepsItsForks: when a holder's stream to the owner ends and the
// holder cannot be reached for a while, the owner keeps the forks it holds (before, one failed
// probe dropped them, and the holder's to_here would never complete). Once its host says it is
// gone, they are dropped (TestForksOfAGoneWorkerAreDropped).
func TestAWorkerCutOffForAWhileKeepsItsForks(t *testing.T) {
	// A link down: no dial gets through, no probe gets an answer.
	partition, holder, owner, lossy, rref, fork := ownerView(t)
	noRoute := errors.New("no route to host")
	partition.dialErr, partition.probe = noRoute, func() error { return noRoute }
	partition.on.Store(true)
	lossy.breakAll()
	time.Sleep(500 * time.Millisecond) // the owner has seen the stream end and asked
	if n := owner.OwnedRRefs(); n != 1 {
		t.Fatalf("owner keeps %d RRefs of a holder it cannot reach for now, want 1", n)
	}
	partition.on.Store(false)
	if err := holder.ReleaseFork(1, rref, fork); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); owner.OwnedRRefs() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the holder's release after the partition did not reach the owner")
		}
	}
}

// TestForksOfAWorkerWhoseListenerLingersAreDropped: a killed holder whose host still takes a
// connection for a moment is not taken for alive: no stream opens, the owner asks again, and
// drops its forks once the host refuses (before, a probe that only connected kept them forever;
// the soak with a killed worker left an RRef behind).
func TestForksOfAWorkerWhoseListenerLingersAreDropped(t *testing.T) {
	// Killed a moment ago: no stream opens; its host takes the first probe's connection (the
	// listening socket outlives the streams for a moment), then refuses.
	dying, _, owner, lossy, _, _ := ownerView(t)
	var probes atomic.Int32
	dying.dialErr = errors.New("EOF during the handshake")
	dying.probe = func() error {
		if probes.Add(1) > 1 {
			return fmt.Errorf("probe: %w", transport.ErrGone)
		}
		return nil
	}
	dying.on.Store(true)
	lossy.breakAll()
	for deadline := time.Now().Add(8 * time.Second); owner.OwnedRRefs() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the owner kept the forks of a holder whose host refuses it")
		}
	}
}

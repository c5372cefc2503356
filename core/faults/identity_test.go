package faults

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/shmtransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// logRecorder is a slog.Handler that keeps what an agent logs, so a test can check the reason
// the agent gave for refusing something.
type logRecorder struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced at every line
}

func newLogRecorder() *logRecorder { return &logRecorder{changed: make(chan struct{})} }

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, b.String())
	close(r.changed)
	r.changed = make(chan struct{})
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

// logger is a logger writing to r.
func (r *logRecorder) logger() *slog.Logger { return slog.New(r) }

// wait returns the first line logged that contains every one of want, waiting up to 10 s for
// it; it fails the test, listing what was logged, if none comes.
func (r *logRecorder) wait(t *testing.T, want ...string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		lines, changed := r.lines, r.changed
		r.mu.Unlock()
	next:
		for _, line := range lines {
			for _, w := range want {
				if !strings.Contains(line, w) {
					continue next
				}
			}
			return line
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("nothing logged within 10 s says %q; logged:\n%s", want, strings.Join(lines, "\n"))
			return ""
		}
	}
}

// TestAPeerCanOnlyActAsItself: a stream's hello must name a worker registered at the host it
// comes from, and a worker can release only the RRef forks it holds itself, so a peer cannot
// make an owner drop a value another worker still uses.
func TestAPeerCanOnlyActAsItself(t *testing.T) {
	dropped := make(chan wire.RRefID, 1)
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, Handlers: echo})
	cfgs[0].OnRRefDropped = func(id wire.RRefID) { dropped <- id }
	ownerLog := newLogRecorder()
	cfgs[0].Logger = ownerLog.logger()
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
	elsewhere, ownerAddr, err := coretest.NetworkTransport(owner, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Close()
	if _, err := elsewhere.Listen("127.0.0.2", func(transport.Stream) {}); err != nil {
		t.Fatal(err)
	}
	s, err := elsewhere.Dial(ctx, ownerAddr)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(wire.HelloFrame("w1", 1, 0))
	s.Send(forged(1))
	s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "echo"})
	if resp, err := s.Recv(); err == nil {
		t.Fatalf("a stream from 127.0.0.2 posing as w1 (registered at %s) was served: %+v", holder.Self().Addr, resp)
	}
	ownerLog.wait(t, "refused a stream: a peer at 127.0.0.2:", `said it was worker "w1", registered at `+holder.Self().Addr)

	// From the right host as w2: its releases of w1's fork, in w1's name or its own, are
	// refused. The echo after them answers once they were applied.
	local, _, err := coretest.NetworkTransport(owner, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	s, err = local.Dial(ctx, ownerAddr)
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
	w0Log := newLogRecorder()
	cfgs[0].Logger = w0Log.logger()
	c := coretest.Start(t, cfgs)
	addr := coretest.SHMAddr(c.Agents[0])
	if addr == "" {
		t.Fatalf("w0 registered no shared-memory address: %s", c.Agents[0].Self().Addr)
	}
	cases := []struct {
		claim  string
		rank   int
		served bool
		reason string // why it is refused, as w0 logs it
	}{
		{"w1", 1, true, ""}, // registered a shared-memory address here
		// did not: a local process cannot pass for it
		{"w2", 2, false, `refused a stream: a peer on this host said it was worker "w2", which registered no shared-memory address here`},
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
			if tc.reason != "" {
				w0Log.wait(t, tc.reason)
			}
		})
	}
}

// Package coretest starts worlds of agents inside one test process.
package coretest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/grpctransport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/tcptransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// Cluster is a world of agents in this process.
type Cluster struct {
	Agents []*core.Agent
}

// Options choose how a cluster is built.
type Options struct {
	// GRPC makes real gRPC agents on loopback with a served store; otherwise agents share an
	// InmemNetwork and a MemStore.
	GRPC bool
	// Handlers are registered on every agent.
	Handlers map[string]core.Handler
	// InitTimeout bounds the rendezvous (default 10 s).
	InitTimeout time.Duration
	// ChunkSize, MaxMessageSize and MaxServedPerCaller are passed to every agent (0: the
	// defaults).
	ChunkSize          int
	MaxMessageSize     int64
	MaxServedPerCaller int
	// Token is the world's shared secret (GRPC worlds).
	Token string
	// TLS puts a GRPC world under mutual TLS.
	TLS *core.TLSFiles
	// Transports pins the transports of a GRPC world (see core.Config.Transports); empty
	// means the default: shared memory between these agents, all on one host.
	Transports []string
	// Network, for a world that is not GRPC, is the network its agents share, so the test
	// can inject faults into it (default: a new one).
	Network *transport.InmemNetwork
}

// FreePort returns a loopback TCP port that was free a moment ago. It is drawn from below the
// kernel's ephemeral range: a port the kernel handed out for ":0" could be handed out again, to
// another test process's listener or outgoing connection, before the world binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	first := ephemeralStart()
	const lowest = 10000
	for range 200 {
		port := lowest + rand.IntN(first-lowest)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatalf("no free loopback port in [%d, %d) after 200 tries", lowest, first)
	return 0
}

// ephemeralStart is the first port of the kernel's ephemeral range (Linux's default if unreadable).
func ephemeralStart() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return linuxDefault
	}
	first, err := strconv.Atoi(fields[0])
	if err != nil || first <= 10000+1000 {
		return linuxDefault
	}
	return first
}

// Configs returns the configs of a world of n workers named w0…w(n-1).
func Configs(t testing.TB, n int, opts Options) []core.Config {
	t.Helper()
	if opts.InitTimeout == 0 {
		opts.InitTimeout = 10 * time.Second
	}
	cfgs := make([]core.Config, n)
	var store rendezvous.Store
	var network *transport.InmemNetwork
	init := ""
	if opts.GRPC {
		init = fmt.Sprintf("tcp://127.0.0.1:%d", FreePort(t))
	} else {
		store, network = rendezvous.NewMemStore(n), opts.Network
		if network == nil {
			network = transport.NewInmemNetwork()
		}
	}
	for i := range cfgs {
		cfgs[i] = core.Config{
			Name: fmt.Sprintf("w%d", i), Rank: i, WorldSize: n,
			InitMethod: init, InitTimeout: opts.InitTimeout, Handlers: opts.Handlers,
			ListenHost: "127.0.0.1", ChunkSize: opts.ChunkSize, MaxMessageSize: opts.MaxMessageSize, MaxServedPerCaller: opts.MaxServedPerCaller,
			Token: opts.Token, TLS: opts.TLS, Transports: opts.Transports,
		}
		if network != nil {
			cfgs[i].Store, cfgs[i].Transport = store, network.Transport()
		}
	}
	return cfgs
}

// StartAll starts one agent per config concurrently and returns them with their errors.
func StartAll(cfgs []core.Config) ([]*core.Agent, []error) {
	agents := make([]*core.Agent, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agents[i], errs[i] = core.Start(context.Background(), cfgs[i])
		}()
	}
	wg.Wait()
	return agents, errs
}

// New starts a world of n agents and shuts it down, not gracefully, when the test ends.
func New(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	return Start(t, Configs(t, n, opts))
}

// Start starts one agent per config, fails the test if any cannot start, and shuts them all
// down, not gracefully, when the test ends.
func Start(t testing.TB, cfgs []core.Config) *Cluster {
	t.Helper()
	agents, errs := StartAll(cfgs)
	c := &Cluster{Agents: agents}
	t.Cleanup(func() { c.Close() })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start agent %d: %v", i, err)
		}
	}
	return c
}

// Close shuts every agent down at once.
func (c *Cluster) Close() {
	for _, a := range c.Agents {
		if a != nil {
			a.Shutdown(context.Background(), false)
		}
	}
}

// Peak samples sample every interval until the returned stop is called, which returns the
// highest value seen.
func Peak(interval time.Duration, sample func() int64) (stop func() int64) {
	done := make(chan struct{})
	result := make(chan int64)
	go func() {
		var peak int64
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			peak = max(peak, sample())
			select {
			case <-done:
				result <- max(peak, sample())
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		return <-result
	}
}

// SHMAddr is the shared-memory address of a, or "" if it has none.
func SHMAddr(a *core.Agent) string {
	addr, _ := transport.ChoiceAddr(a.Self().Addr, core.TransportSHM)
	return addr
}

// SendHooked is a transport whose dialed streams call onSend before each Send: a test's delay,
// or with an error a failure, on one side's sends.
func SendHooked(t transport.Transport, onSend func(*wire.Frame) error) transport.Transport {
	return sendHooked{t, onSend}
}

type sendHooked struct {
	transport.Transport
	onSend func(*wire.Frame) error
}

func (t sendHooked) Dial(ctx context.Context, addr string) (transport.Stream, error) {
	s, err := t.Transport.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return hookedStream{s, t.onSend}, nil
}

type hookedStream struct {
	transport.Stream
	onSend func(*wire.Frame) error
}

func (s hookedStream) Send(f *wire.Frame) error {
	if err := s.onSend(f); err != nil {
		return err
	}
	return s.Stream.Send(f)
}

// NetworkAddr is a's address on the transport NetworkTransport makes.
func NetworkAddr(a *core.Agent) string {
	if addr, ok := transport.ChoiceAddr(a.Self().Addr, core.TransportGRPC); ok {
		return addr
	}
	addr, _ := transport.ChoiceAddr(a.Self().Addr, core.TransportTCP)
	return addr
}

// NetworkTransport is a new transport of the kind a serves on between hosts, with a's address
// on it, for tests that speak to a worker's network port themselves: gRPC where a listens on
// it, else plain TCP (a world pinned to "tcp"). Running a test under each pin covers both.
func NetworkTransport(a *core.Agent, token string, files *core.TLSFiles) (transport.Transport, string, error) {
	if addr, ok := transport.ChoiceAddr(a.Self().Addr, core.TransportGRPC); ok {
		tr, err := grpctransport.New(token, files)
		return tr, addr, err
	}
	addr, ok := transport.ChoiceAddr(a.Self().Addr, core.TransportTCP)
	if !ok {
		return nil, "", fmt.Errorf("%s listens on no network transport: %s", a.Self().Name, a.Self().Addr)
	}
	tr, err := tcptransport.New(token, files)
	return tr, addr, err
}

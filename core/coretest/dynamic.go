package coretest

import (
	"context"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// DynamicWorld is a dynamic world (core.Config.WorldSize 0) in this process: a membership store
// and an in-memory network that agents join and leave one at a time.
type DynamicWorld struct {
	Store    *rendezvous.MemStore
	Network  *transport.InmemNetwork
	Handlers map[string]core.Handler
}

// NewDynamicWorld returns an empty dynamic world whose agents get handlers.
func NewDynamicWorld(handlers map[string]core.Handler) *DynamicWorld {
	return &DynamicWorld{Store: rendezvous.NewMemStore(0), Network: transport.NewInmemNetwork(), Handlers: handlers}
}

// Config is the config of a worker joining the world; its transport is returned too, so a
// test can end it as a process's death would.
func (d *DynamicWorld) Config(name string, rank int) (core.Config, *transport.InmemTransport) {
	tr := d.Network.Transport()
	return core.Config{
		Name: name, Rank: rank, InitTimeout: 10 * time.Second, Handlers: d.Handlers,
		Store: d.Store, Transport: tr,
	}, tr
}

// Join starts a worker in the world, failing the test if it cannot join, and shuts it down,
// not gracefully, when the test ends.
func (d *DynamicWorld) Join(t testing.TB, name string, rank int) (*core.Agent, *transport.InmemTransport) {
	t.Helper()
	cfg, tr := d.Config(name, rank)
	a, err := core.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("join %s as rank %d: %v", name, rank, err)
	}
	t.Cleanup(func() { a.Shutdown(context.Background(), false) })
	return a, tr
}

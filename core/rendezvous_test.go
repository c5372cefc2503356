package core_test

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

func TestRendezvousErrors(t *testing.T) {
	tests := []struct {
		name   string
		n      int
		mutate func(cfgs []core.Config) []core.Config
		want   string
	}{
		{name: "duplicate names", n: 3, mutate: func(c []core.Config) []core.Config { c[2].Name = "w0"; return c }, want: "RPC worker name w0 is not unique. Workers 0 and 2 share the same name."},
		{name: "duplicate ranks", n: 3, mutate: func(c []core.Config) []core.Config { c[2].Rank = 1; return append(c, c[0]) }, want: "rank 1 was taken by both"},
		{name: "worker never comes", n: 3, mutate: func(c []core.Config) []core.Config { return c[:2] }, want: "ranks [2] of world size 3 never joined"},
		{name: "rank out of range", n: 2, mutate: func(c []core.Config) []core.Config { c[1].Rank = 5; return c }, want: "rank 5 is out of range for world_size 2"},
		{name: "bad name", n: 2, mutate: func(c []core.Config) []core.Config { c[1].Name = "a b"; return c }, want: "worker name must match"},
	}
	for _, grpc := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(tt.name+map[bool]string{false: "/inmem", true: "/grpc"}[grpc], func(t *testing.T) {
				cfgs := coretest.Configs(t, tt.n, coretest.Options{GRPC: grpc, InitTimeout: time.Second})
				cfgs = tt.mutate(cfgs)
				if strings.Contains(tt.name, "duplicate ranks") {
					cfgs = cfgs[1:] // ranks 1, 1 and 0 again: exactly one rank 0 must serve the store
					cfgs[len(cfgs)-1].Rank = 0
				}
				start := time.Now()
				agents, errs := coretest.StartAll(cfgs)
				defer func() {
					for _, a := range agents {
						if a != nil {
							a.Shutdown(t.Context(), false)
						}
					}
				}()
				found := false
				for _, err := range errs {
					if err != nil && strings.Contains(err.Error(), tt.want) {
						found = true
					}
				}
				if !found {
					t.Fatalf("errors %v, want one containing %q", errs, tt.want)
				}
				if took := time.Since(start); took > 8*time.Second {
					t.Fatalf("took %v to fail", took)
				}
				for _, err := range errs {
					if err != nil && !errors.Is(err, core.ErrRendezvous) && !strings.Contains(err.Error(), "worker name") && !strings.Contains(err.Error(), "out of range") {
						t.Errorf("error %v does not wrap ErrRendezvous", err)
					}
				}
			})
		}
	}
}

func TestMasterPortInUse(t *testing.T) {
	cfgs := coretest.Configs(t, 1, coretest.Options{GRPC: true, InitTimeout: time.Second})
	first, err := core.Start(t.Context(), cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer first.Shutdown(t.Context(), false)
	_, err = core.Start(t.Context(), cfgs[0])
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err = %v, want address already in use", err)
	}
}

func TestFileStoreWorld(t *testing.T) {
	path := t.TempDir() + "/world"
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, Handlers: testHandlers(nil)})
	for i := range cfgs {
		cfgs[i].InitMethod = "file://" + path
	}
	agents := coretest.Start(t, cfgs).Agents
	resp, err := agents[2].Call(t.Context(), "w0", "echo", core.Message{Payload: []byte("via file")})
	if err != nil || string(resp.Payload) != "via file" {
		t.Fatalf("got %q, %v", resp.Payload, err)
	}
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); a.Shutdown(t.Context(), true) }()
	}
	wg.Wait()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the store file outlived the world: %v", err)
	}
	// The same path serves a new world.
	solo := cfgs[0]
	solo.WorldSize = 1
	again, err := core.Start(t.Context(), solo)
	if err != nil {
		t.Fatalf("a new world on the same path: %v", err)
	}
	again.Shutdown(t.Context(), true)
}

// A store served on port 0 gets a free port, which rank 0 hands to StoreServed before it
// waits for the others; they join through the port it got. A rank other than 0 cannot dial
// port 0.
func TestStoreServedOnAFreePort(t *testing.T) {
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, InitTimeout: 5 * time.Second})
	for i := range cfgs {
		cfgs[i].InitMethod = "tcp://127.0.0.1:0"
	}
	_, err := core.Start(t.Context(), cfgs[1])
	if err == nil || !errors.Is(err, core.ErrRendezvous) || !strings.Contains(err.Error(), "port 0 asks rank 0 for a free port") {
		t.Fatalf("rank 1 dialing port 0: err = %v, want the port-0 refusal", err)
	}
	served := make(chan string, 1)
	cfgs[0].StoreServed = func(addr string) { served <- addr }
	agents := make([]*core.Agent, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); agents[0], errs[0] = core.Start(t.Context(), cfgs[0]) }()
	var addr string
	select {
	case addr = <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("rank 0 never reported its store's address")
	}
	if strings.HasSuffix(addr, ":0") || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("served address %q, want 127.0.0.1 and the port it got", addr)
	}
	for i := 1; i < len(cfgs); i++ {
		cfgs[i].InitMethod = "tcp://" + addr
		wg.Add(1)
		go func() { defer wg.Done(); agents[i], errs[i] = core.Start(t.Context(), cfgs[i]) }()
	}
	wg.Wait()
	for i, a := range agents {
		if errs[i] != nil {
			t.Fatalf("rank %d: %v", i, errs[i])
		}
		defer a.Shutdown(t.Context(), false)
	}
	if got := len(agents[2].Workers()); got != 3 {
		t.Fatalf("rank 2 sees %d workers, want 3", got)
	}
}

package core

import (
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// A stream's hello names a member by rank, name and epoch: an earlier member of that rank is
// refused without asking the store, a later one is looked up in it.
func TestKnownCallerTellsMembersApart(t *testing.T) {
	store, network := rendezvous.NewMemStore(0), transport.NewInmemNetwork()
	start := func(name string, rank int) *Agent {
		a, err := Start(testctx.For(t), Config{Name: name, Rank: rank, Store: store, Transport: network.Transport()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Shutdown(testctx.For(t), false) })
		return a
	}
	w0, w1 := start("w0", 0), start("w1", 1)
	epoch := w1.epoch
	for _, tc := range []struct {
		hello wire.Hello
		known bool
	}{
		{wire.Hello{Name: "w1", Rank: 1, Epoch: epoch}, true},
		{wire.Hello{Name: "w1", Rank: 1, Epoch: epoch - 1}, false}, // an earlier w1
		{wire.Hello{Name: "w9", Rank: 1, Epoch: epoch}, false},
		{wire.Hello{Name: "w2", Rank: 2, Epoch: epoch + 100}, false}, // not in the store either
	} {
		if got := w0.knownCaller(tc.hello) != nil; got != tc.known {
			t.Errorf("hello %+v: known = %v, want %v", tc.hello, got, tc.known)
		}
	}
	// A worker that joined without telling w0 (its notice lost) is found in the store.
	record, _ := msgpack.Marshal(&memberRecord{Info: WorkerInfo{Name: "w2", ID: 2, Addr: "inmem-x"}})
	ms, err := store.JoinMembers(testctx.For(t), rendezvous.Member{Rank: 2, Name: "w2", Value: record})
	if err != nil {
		t.Fatal(err)
	}
	if w0.knownCaller(wire.Hello{Name: "w2", Rank: 2, Epoch: ms.Version}) == nil {
		t.Fatal("a member that joined after w0's view was refused")
	}
}

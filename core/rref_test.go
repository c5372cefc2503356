package core

import (
	"cmp"
	"slices"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

func TestRefTableOrders(t *testing.T) {
	r := wire.RRefID{Creator: 1, Local: 7}
	f := func(n int64) wire.ForkID { return wire.ForkID{Creator: 1, Local: n} }
	add := func(n int64, holder int) wire.RefOp {
		return wire.RefOp{Kind: wire.RefAdd, RRef: r, Fork: f(n), Holder: holder}
	}
	rel := func(n int64, holder int) wire.RefOp {
		return wire.RefOp{Kind: wire.RefRelease, RRef: r, Fork: f(n), Holder: holder}
	}
	tests := []struct {
		name string
		ops  []wire.RefOp
		// droppedAt is the index of the op after which the RRef is referenced nowhere; -1: never.
		droppedAt int
	}{
		{name: "create then release", ops: []wire.RefOp{add(1, 1), rel(1, 1)}, droppedAt: 1},
		{name: "fork outlives its parent", ops: []wire.RefOp{add(1, 1), add(2, 2), rel(1, 1), rel(2, 2)}, droppedAt: 3},
		{name: "release overtakes its add", ops: []wire.RefOp{add(1, 1), rel(2, 2), rel(1, 1), add(2, 2)}, droppedAt: 3},
		{name: "release before any add", ops: []wire.RefOp{rel(2, 2), add(1, 1), add(2, 2), rel(1, 1)}, droppedAt: 3},
		{name: "still held", ops: []wire.RefOp{add(1, 1), add(2, 2), rel(2, 2)}, droppedAt: -1},
		// A worker cannot release a fork another holds, nor take it over by adding it again.
		{name: "release by another holder", ops: []wire.RefOp{add(1, 1), rel(1, 3)}, droppedAt: -1},
		{name: "re-add under another holder", ops: []wire.RefOp{add(1, 1), add(1, 3), rel(1, 3)}, droppedAt: -1},
		{name: "forged early release", ops: []wire.RefOp{add(1, 1), rel(2, 3), add(2, 2), rel(1, 1)}, droppedAt: -1},
		{name: "forged release after the real one", ops: []wire.RefOp{add(1, 1), rel(2, 2), rel(2, 3), add(2, 2), rel(1, 1)}, droppedAt: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := newRefTable()
			for i, op := range tt.ops {
				if got, want := table.apply(op), i == tt.droppedAt; got != want {
					t.Fatalf("after op %d: dropped = %v, want %v", i, got, want)
				}
			}
			if want := map[bool]int{true: 0, false: 1}[tt.droppedAt >= 0]; table.len() != want {
				t.Fatalf("table holds %d entries, want %d", table.len(), want)
			}
		})
	}
}

func TestRefTableReleaseHolder(t *testing.T) {
	table := newRefTable()
	a, b := wire.RRefID{Creator: 0, Local: 1}, wire.RRefID{Creator: 0, Local: 2}
	table.apply(wire.RefOp{Kind: wire.RefAdd, RRef: a, Fork: wire.ForkID{Creator: 0, Local: 3}, Holder: 2})
	table.apply(wire.RefOp{Kind: wire.RefAdd, RRef: b, Fork: wire.ForkID{Creator: 0, Local: 4}, Holder: 2})
	table.apply(wire.RefOp{Kind: wire.RefAdd, RRef: b, Fork: wire.ForkID{Creator: 0, Local: 5}, Holder: 1})
	// Worker 1 released a fork worker 2 made and was still to register: it never will.
	c := wire.RRefID{Creator: 0, Local: 6}
	table.apply(wire.RefOp{Kind: wire.RefRelease, RRef: c, Fork: wire.ForkID{Creator: 2, Local: 7}, Holder: 1})
	dropped := table.releaseHolder(2, 0)
	slices.SortFunc(dropped, func(x, y wire.RRefID) int { return cmp.Compare(x.Local, y.Local) })
	if len(dropped) != 2 || dropped[0] != a || dropped[1] != c || table.len() != 1 {
		t.Fatalf("dropped %v, %d left; want %v and %v dropped", dropped, table.len(), a, c)
	}
}

// A worker that left and joined again under its id is another member: releasing the forks of
// the one that left keeps the new one's, and a release by one does not free the other's.
func TestRefTableTellsMembersOfOneIDApart(t *testing.T) {
	table := newRefTable()
	r := wire.RRefID{Creator: 0, Local: 1}
	oldFork, newFork := wire.ForkID{Creator: 0, Local: 2}, wire.ForkID{Creator: 0, Local: 3}
	table.apply(wire.RefOp{Kind: wire.RefAdd, RRef: r, Fork: oldFork, Holder: 1, HolderEpoch: 4})
	table.apply(wire.RefOp{Kind: wire.RefAdd, RRef: r, Fork: newFork, Holder: 1, HolderEpoch: 9})
	if table.apply(wire.RefOp{Kind: wire.RefRelease, RRef: r, Fork: newFork, Holder: 1, HolderEpoch: 4}) {
		t.Fatal("the member that left released the new member's fork")
	}
	if dropped := table.releaseHolder(1, 4); len(dropped) != 0 || table.len() != 1 {
		t.Fatalf("dropping the member that left dropped %v", dropped)
	}
	if !table.apply(wire.RefOp{Kind: wire.RefRelease, RRef: r, Fork: newFork, Holder: 1, HolderEpoch: 9}) {
		t.Fatal("the new member's release did not drop the value")
	}
}

package rendezvous

import (
	"runtime"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core/internal/msgpackcodec"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc/mem"
)

// FuzzStoreRequest feeds arbitrary bytes to the rendezvous store as a stranger could send
// them to rank 0: decoded as the gRPC handler decodes them, then admitted to a round. The
// store must refuse cleanly, never panic, never allocate by a size the request merely
// claims (in decoding or admitting), and admit only what fits its world and limits.
func FuzzStoreRequest(f *testing.F) {
	for _, req := range []GatherRequest{
		{Round: JoinRound, Rank: 1, Size: 4, Who: `"w1"`, Value: []byte("record"), WaitMs: 60_000},
		{Round: JoinRound, Rank: 1, Size: 1 << 62},
	} {
		b, err := msgpack.Marshal(&req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const worldSize = 4
		store := NewMemStore(worldSize)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var req GatherRequest
		decodeErr := (msgpackcodec.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &req)
		var r *gatherRound
		var err error
		if decodeErr == nil {
			r, err = store.enter(req)
		}
		runtime.ReadMemStats(&after)
		// Decoding keeps about the input, and a round of four is a few hundred bytes; 1 MiB
		// more is far below what a claimed size worth worrying about would take, and far
		// above noise.
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 2*uint64(len(data))+1<<20 {
			t.Fatalf("decoding and admitting %d bytes allocated %d bytes", len(data), grew)
		}
		if decodeErr != nil {
			return
		}
		if err != nil {
			if n := store.liveRounds(); n != 0 {
				t.Fatalf("refused (%v), yet %d rounds are under way", err, n)
			}
			return
		}
		switch {
		case req.Size != worldSize, req.Rank < 0, req.Rank >= worldSize:
			t.Fatalf("admitted %+v to a world of %d", clipRequest(req), worldSize)
		case req.Round == "", len(req.Round) > maxRoundNameBytes, len(req.Who) > maxWhoBytes, len(req.Value) > maxStoreValueBytes:
			t.Fatalf("admitted %+v over a limit", clipRequest(req))
		case r.size != worldSize || len(r.who) != worldSize || len(r.values) != worldSize:
			t.Fatalf("round of size %d (%d, %d slots) in a world of %d", r.size, len(r.who), len(r.values), worldSize)
		}
		// The same participant again (a client retrying) waits with the round and counts once.
		joined := r.joined
		if again, err := store.enter(req); err != nil || again != r || r.err != nil || r.joined != joined {
			t.Fatalf("the same participant again: err %v, round error %v, joined %d -> %d", err, r.err, joined, r.joined)
		}
		// Another participant on the same rank spoils the round for everyone, and it leaves
		// the store.
		other := req
		other.Who = "another " + clip(req.Who)
		if _, err := store.enter(other); err != nil {
			t.Fatalf("a duplicate joining a round under way: %v", err)
		}
		if r.err == nil {
			t.Fatal("a duplicate rank did not fail the round")
		}
		if n := store.liveRounds(); n != 0 {
			t.Fatalf("%d rounds under way after the round failed", n)
		}
	})
}

// clipRequest shortens a request's strings for a failure message.
func clipRequest(req GatherRequest) GatherRequest {
	req.Round, req.Who = clip(req.Round), clip(req.Who)
	if len(req.Value) > 32 {
		req.Value = req.Value[:32]
	}
	return req
}

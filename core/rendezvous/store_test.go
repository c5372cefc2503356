package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/internal/secure"
	"github.com/vmihailenco/msgpack/v5"
)

func TestMissingRanksInRankOrder(t *testing.T) {
	tests := []struct {
		joined []string
		want   string
	}{
		{joined: []string{"a", "", "c"}, want: "[1]"},
		{joined: []string{"", "b", "", "", "", "", "", "", "", "", "", ""}, want: "[0 2 3 4 5 6 7 8 9 10 11]"},
		{joined: []string{"a"}, want: "[]"},
	}
	for _, tt := range tests {
		if got := missingRanks(len(tt.joined), tt.joined); got != tt.want {
			t.Errorf("missingRanks(%q) = %s, want %s", tt.joined, got, tt.want)
		}
	}
}

// storeTestContext bounds a store test; every wait in these tests is under it.
func storeTestContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// servedStore serves mem on loopback until the test ends and returns a client of it that dials
// the address via gives (the server's own, or a proxy's in front of it).
func servedStore(t *testing.T, mem *MemStore, via func(addr string) string) *RemoteStore {
	t.Helper()
	srv, err := ServeStore("127.0.0.1:0", mem, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	remote, err := DialStore(via(srv.Addr()), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remote.Close() })
	return remote
}

// gatherWorld joins every rank of a world of size to round through store, concurrently,
// and returns what each got.
func gatherWorld(ctx context.Context, store Store, round string, size int) ([][][]byte, []error) {
	values := make([][][]byte, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			values[rank], errs[rank] = store.Gather(ctx, GatherRequest{
				Round: round, Rank: rank, Size: size, Who: fmt.Sprintf(`"w%d"`, rank), Value: []byte{byte(rank)}, WaitMs: 10_000,
			})
		}()
	}
	wg.Wait()
	return values, errs
}

// formsWorld fails the test unless every rank of a world of size completes round.
func formsWorld(t *testing.T, ctx context.Context, store Store, round string, size int) {
	t.Helper()
	values, errs := gatherWorld(ctx, store, round, size)
	checkWorld(t, values, errs)
}

func checkWorld(t *testing.T, values [][][]byte, errs []error) {
	t.Helper()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		for from, v := range values[rank] {
			if len(v) != 1 || v[0] != byte(from) {
				t.Fatalf("rank %d got %v from rank %d", rank, v, from)
			}
		}
	}
}

// TestMemStoreRefusesBadRequests: a request that is malformed, for another world size or over
// a limit is refused with an error naming what was wrong, registers nothing, and the store
// goes on serving the real world.
func TestMemStoreRefusesBadRequests(t *testing.T) {
	ok := GatherRequest{Round: "join", Rank: 1, Size: 4, Who: `"w1"`, Value: []byte("record")}
	tests := []struct {
		name   string
		mutate func(*GatherRequest)
		want   []string
	}{
		{name: "huge size", mutate: func(r *GatherRequest) { r.Size = 1 << 62 }, want: []string{"world size 4611686018427387904", "this world's size is 4"}},
		{name: "smaller size", mutate: func(r *GatherRequest) { r.Size = 3 }, want: []string{"world size 3", "this world's size is 4"}},
		{name: "zero size", mutate: func(r *GatherRequest) { r.Size = 0 }, want: []string{"world size 0", "this world's size is 4"}},
		{name: "negative size", mutate: func(r *GatherRequest) { r.Size = -4 }, want: []string{"world size -4", "this world's size is 4"}},
		{name: "negative rank", mutate: func(r *GatherRequest) { r.Rank = -1 }, want: []string{"rank -1", "out of range for world size 4"}},
		{name: "rank past the world", mutate: func(r *GatherRequest) { r.Rank = 4 }, want: []string{"rank 4", "out of range for world size 4"}},
		{name: "empty round", mutate: func(r *GatherRequest) { r.Round = "" }, want: []string{"round name is empty"}},
		{name: "long round", mutate: func(r *GatherRequest) { r.Round = strings.Repeat("r", maxRoundNameBytes+1) }, want: []string{"round name", "(257 bytes)", "longer than the 256 bytes allowed"}},
		{name: "nameless", mutate: func(r *GatherRequest) { r.Who = "" }, want: []string{"rank 1 did not name itself"}},
		{name: "long who", mutate: func(r *GatherRequest) { r.Who = strings.Repeat("w", 1<<20) }, want: []string{"participant's name", "(1048576 bytes)", "longer than the 512 bytes allowed"}},
		{name: "big value", mutate: func(r *GatherRequest) { r.Value = make([]byte, maxStoreValueBytes+1) }, want: []string{"value of 65537 bytes", "more than the 65536 allowed"}},
	}
	ctx := storeTestContext(t)
	store := NewMemStore(4)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := ok
			tt.mutate(&req)
			_, err := store.Gather(ctx, req)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v, want it to say %q", err, want)
				}
			}
			if len(err.Error()) > 300 {
				t.Errorf("the error echoes the request: %d bytes", len(err.Error()))
			}
			if n := store.liveRounds(); n != 0 {
				t.Errorf("a refused request left %d rounds under way", n)
			}
		})
	}
	formsWorld(t, ctx, store, "join", 4)
}

// TestGatherRequestDecodes: the store's own decoder reads what the default encoder writes,
// and refuses fields it does not know and lengths no store request can have.
func TestGatherRequestDecodes(t *testing.T) {
	for _, want := range []GatherRequest{
		{Round: JoinRound, Rank: 3, Size: 4, Who: `"w3"`, Value: []byte("record"), WaitMs: 60_000},
		{Round: ShutdownRound, Rank: 0, Size: 1 << 40, Value: make([]byte, maxStoreValueBytes), WaitMs: -1},
		{},
	} {
		b, err := msgpack.Marshal(&want)
		if err != nil {
			t.Fatal(err)
		}
		var got GatherRequest
		if err := msgpack.Unmarshal(b, &got); err != nil {
			t.Fatalf("decode %q: %v", clip(string(b)), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %+v, want %+v", clipRequest(got), clipRequest(want))
		}
	}
	for _, tt := range []struct{ data, want string }{
		{data: "\x81\xa5extra\x01", want: `field "extra": not a field of a store request`},
		{data: "\x81\xa5value\xc6\x7f\xff\xff\xff", want: `field "value": it claims 2147483647 bytes`},
		{data: "\x81\xdb\x7f\xff\xff\xff", want: "a key: it claims 2147483647 bytes"},
		{data: "\x81\xa5round\xdb\x7f\xff\xff\xff", want: `field "round": it claims 2147483647 bytes`},
	} {
		var got GatherRequest
		if err := msgpack.Unmarshal([]byte(tt.data), &got); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("decode %q: err = %v, want %q", tt.data, err, tt.want)
		}
	}
}

// TestMemStoreCapsLiveRounds: strangers can open at most maxLiveRounds rounds, and those do not
// keep the project's own rounds out.
func TestMemStoreCapsLiveRounds(t *testing.T) {
	store := NewMemStore(2)
	for i := range maxLiveRounds {
		if _, err := store.enter(GatherRequest{Who: `"x"`, Round: fmt.Sprint("r", i), Rank: 0, Size: 2}); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	_, err := store.enter(GatherRequest{Who: `"x"`, Round: "one too many", Rank: 0, Size: 2})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d rounds are under way already", maxLiveRounds)) {
		t.Fatalf("err = %v, want the live round cap named", err)
	}
	// A round under way still takes its other participants.
	if _, err := store.enter(GatherRequest{Who: `"x"`, Round: "r3", Rank: 1, Size: 2}); err != nil {
		t.Fatalf("joining a round under way: %v", err)
	}
	formsWorld(t, storeTestContext(t), store, JoinRound, 2)
	if n := store.liveRounds(); n != maxLiveRounds-1 {
		t.Fatalf("%d rounds under way, want %d", n, maxLiveRounds-1)
	}
}

// TestMemStoreFreesFinishedRounds: a round that is over, however it ended, leaves the store,
// and whoever comes later is told so instead of opening a round that never completes.
func TestMemStoreFreesFinishedRounds(t *testing.T) {
	ctx := storeTestContext(t)
	t.Run("completed", func(t *testing.T) {
		store := NewMemStore(3)
		formsWorld(t, ctx, store, JoinRound, 3)
		if n := store.liveRounds(); n != 0 {
			t.Fatalf("%d rounds under way after the join completed", n)
		}
		_, err := store.Gather(ctx, GatherRequest{Round: JoinRound, Rank: 1, Size: 3, Who: `"late"`, WaitMs: 10_000})
		if err == nil || !strings.Contains(err.Error(), `round "join" is already over`) {
			t.Fatalf("late joiner: err = %v, want the round said to be over", err)
		}
		if n := store.liveRounds(); n != 0 {
			t.Fatalf("the late joiner opened a round")
		}
	})
	t.Run("completed by marks", func(t *testing.T) {
		store := NewMemStore(4)
		store.MarkGone(ShutdownRound, 3) // before the round exists
		r, err := store.enter(GatherRequest{Who: `"x"`, Round: ShutdownRound, Rank: 0, Size: 4, Value: []byte{1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.enter(GatherRequest{Who: `"x"`, Round: ShutdownRound, Rank: 1, Size: 4, Value: []byte{1}}); err != nil {
			t.Fatal(err)
		}
		store.MarkGone(ShutdownRound, 2)
		select {
		case <-r.done:
		case <-ctx.Done():
			t.Fatal("the round did not complete when the last rank was marked gone")
		}
		if r.err != nil || r.values[2] != nil || r.values[3] != nil || r.values[1] == nil {
			t.Fatalf("values %v, err %v", r.values, r.err)
		}
		if n := store.liveRounds(); n != 0 {
			t.Fatalf("%d rounds under way after the barrier completed", n)
		}
		store.MarkGone(ShutdownRound, 1) // after it is over: nothing to do, nothing kept
		if len(store.gone) != 0 {
			t.Fatalf("a mark for a finished round was kept: %v", store.gone)
		}
		_, err = store.enter(GatherRequest{Who: `"x"`, Round: ShutdownRound, Rank: 2, Size: 4})
		if err == nil || !strings.Contains(err.Error(), `round "shutdown" is already over`) {
			t.Fatalf("err = %v, want the round said to be over", err)
		}
	})
	t.Run("failed", func(t *testing.T) {
		store := NewMemStore(3)
		for _, who := range []string{`"a"`, `"b"`} {
			store.enter(GatherRequest{Round: JoinRound, Rank: 1, Size: 3, Who: who})
		}
		if n := store.liveRounds(); n != 0 {
			t.Fatalf("%d rounds under way after the join failed", n)
		}
		_, err := store.Gather(ctx, GatherRequest{Round: JoinRound, Rank: 0, Size: 3, Who: `"c"`, WaitMs: 10_000})
		if err == nil || !strings.Contains(err.Error(), `rank 1 was taken by both "a" and "b"`) {
			t.Fatalf("late joiner of a failed round: err = %v, want the round's own error", err)
		}
	})
}

// TestMemStoreMemoryIsBounded: finished rounds are remembered, and marks for rounds not yet
// made kept, only up to their limits.
func TestMemStoreMemoryIsBounded(t *testing.T) {
	store := NewMemStore(1) // every round completes as it is entered
	const rounds = 3 * finishedRoundsKept
	for i := range rounds {
		if _, err := store.enter(GatherRequest{Who: `"x"`, Round: fmt.Sprint("r", i), Rank: 0, Size: 1}); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	if n := len(store.finished); n != finishedRoundsKept {
		t.Fatalf("%d finished rounds remembered, want %d", n, finishedRoundsKept)
	}
	if _, err := store.enter(GatherRequest{Who: `"x"`, Round: fmt.Sprint("r", rounds-1), Rank: 0, Size: 1}); err == nil || !strings.Contains(err.Error(), "already over") {
		t.Fatalf("the newest finished round: err = %v, want it said to be over", err)
	}
	if _, err := store.enter(GatherRequest{Who: `"x"`, Round: "r0", Rank: 0, Size: 1}); err != nil {
		t.Fatalf("the oldest finished round is forgotten, so it can run again: %v", err)
	}

	store = NewMemStore(4)
	for i := range 10 * maxLiveRounds {
		store.MarkGone(fmt.Sprint("r", i), i%4)
	}
	store.MarkGone("r0", 4)
	store.MarkGone("r0", -1)
	store.MarkGone(strings.Repeat("r", maxRoundNameBytes+1), 0)
	if n := len(store.gone); n != maxLiveRounds {
		t.Fatalf("marks kept for %d rounds not yet made, want at most %d", n, maxLiveRounds)
	}
	if marks := store.gone["r0"]; len(marks) != 1 || !marks[0] {
		t.Fatalf("marks for r0 = %v, want only rank 0", marks)
	}
}

// TestStoreServerSurvivesHostileGather: over gRPC, as a stranger would send them, requests
// that once crashed rank 0 or that are too big are refused, and the store goes on serving.
func TestStoreServerSurvivesHostileGather(t *testing.T) {
	ctx := storeTestContext(t)
	mem := NewMemStore(2)
	remote := servedStore(t, mem, func(addr string) string { return addr })
	tests := []struct {
		name string
		req  GatherRequest
		want string
	}{
		{name: "huge size", req: GatherRequest{Round: "join", Rank: 1, Size: 1 << 62}, want: "world size 4611686018427387904, but this world's size is 2"},
		{name: "negative rank", req: GatherRequest{Round: "join", Rank: -1, Size: 2, Who: "x"}, want: "rank -1 (x) is out of range for world size 2"},
		{name: "big value", req: GatherRequest{Round: "join", Rank: 1, Size: 2, Value: make([]byte, maxStoreValueBytes+1)}, want: "more than the 65536 allowed"},
		{name: "huge request", req: GatherRequest{Round: "join", Rank: 1, Size: 2, Value: make([]byte, 1<<20)}, want: "larger than max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.WaitMs = 10_000
			_, err := remote.Gather(ctx, tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to say %q", err, tt.want)
			}
		})
	}
	// A dozen bytes claiming a 2 GiB value are refused without the 2 GiB being allocated.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	claim := msgpack.RawMessage("\x81\xa5value\xc6\x7f\xff\xff\xff")
	err := remote.cc.Invoke(ctx, storeGatherPath, &claim, &gatherReply{})
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "claims 2147483647 bytes") {
		t.Fatalf("a request claiming a 2 GiB value: err = %v, want the claim refused", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("a request claiming a 2 GiB value cost %d bytes", grew)
	}
	// The world's own join, one rank in the host's process and one remote, still forms.
	values := make([][][]byte, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for rank, store := range []Store{mem, remote} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			values[rank], errs[rank] = store.Gather(ctx, GatherRequest{Round: JoinRound, Rank: rank, Size: 2, Who: fmt.Sprintf(`"w%d"`, rank), Value: []byte{byte(rank)}, WaitMs: 10_000})
		}()
	}
	wg.Wait()
	checkWorld(t, values, errs)
}

// TestStoreWarnsWhenOpenWithoutAToken: a store served beyond loopback without a token says so,
// naming the store and what to do. (When warnings are said, and how often: package secure.)
func TestStoreWarnsWhenOpenWithoutAToken(t *testing.T) {
	secure.ForgetWarnings()
	defer secure.ForgetWarnings()
	var logged bytes.Buffer
	previous := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	defer slog.SetDefault(previous)
	srv, err := ServeStore("0.0.0.0:0", NewMemStore(1), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if !strings.Contains(logged.String(), "rendezvous store listens on") || !strings.Contains(logged.String(), "TENSORPLAY_RPC_TOKEN") {
		t.Fatalf("want a warning naming the store and the token:\n%s", logged.String())
	}
}

// TestClosingTheStoreEndsTheRoundsItsHostWillNotJoin: when the store's host leaves (a
// non-graceful shutdown of rank 0 while the others wait in the shutdown barrier, or a join
// that timed out on rank 0 first), the rounds still waiting fail at once as the store being
// gone, naming who never came, and new ones are refused, instead of waiting for the host or
// for the close to give up on them.
func TestClosingTheStoreEndsTheRoundsItsHostWillNotJoin(t *testing.T) {
	tests := []struct {
		round       string
		failFast    bool
		wantMissing string
	}{
		{round: ShutdownRound, failFast: true, wantMissing: "ranks [0 2] of world size 3 never joined"},
		{round: JoinRound, failFast: false, wantMissing: "ranks [0 2] of world size 3 never joined"},
	}
	for _, tt := range tests {
		t.Run(tt.round, func(t *testing.T) {
			ctx := storeTestContext(t)
			mem := NewMemStore(3)
			srv, err := ServeStore("127.0.0.1:0", mem, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			remote, err := DialStore(srv.Addr(), "", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer remote.Close()
			waiting := make(chan error, 1)
			go func() {
				_, err := remote.Gather(ctx, GatherRequest{Round: tt.round, Rank: 1, Size: 3, Who: `"w1"`, Value: []byte{1}, WaitMs: 15_000, FailFast: tt.failFast})
				waiting <- err
			}()
			eventually(t, "rank 1 reached the store", func() bool { return admitted(mem) == 1 })
			srv.Close()
			err = <-waiting
			if !errors.Is(err, ErrStoreGone) || !strings.Contains(err.Error(), "hosted it left") || !strings.Contains(err.Error(), tt.wantMissing) {
				t.Fatalf("the waiting round ended with %v; want ErrStoreGone saying its host left and %q", err, tt.wantMissing)
			}
			_, err = mem.Gather(ctx, GatherRequest{Round: "late", Rank: 0, Size: 3, Who: `"w0"`, Value: []byte{0}, WaitMs: 15_000})
			if !errors.Is(err, errStoreClosed) {
				t.Fatalf("a round opened after the close ended with %v; want errStoreClosed", err)
			}
		})
	}
}

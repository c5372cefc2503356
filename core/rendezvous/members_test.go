package rendezvous

import (
	"errors"
	"fmt"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"runtime"
	"testing"

	"github.com/tensorplay/tensorplay-rpc/core/internal/msgpackcodec"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc/mem"
)

// memberStores runs a test on a MemStore and on the same store served over gRPC.
func memberStores(t *testing.T, test func(t *testing.T, s MemberStore)) {
	t.Run("mem", func(t *testing.T) { test(t, NewMemStore(0)) })
	t.Run("grpc", func(t *testing.T) {
		srv, err := ServeStore("127.0.0.1:0", NewMemStore(0), "secret", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		client, err := DialStore(srv.Addr(), "secret", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		test(t, client)
	})
}

func TestMembersJoinAndLeave(t *testing.T) {
	memberStores(t, func(t *testing.T, s MemberStore) {
		ctx := testctx.For(t)
		a, err := s.JoinMembers(ctx, Member{Rank: 0, Name: "a", Value: []byte("ra")})
		if err != nil || a.Version != 1 || len(a.Members) != 1 || a.Members[0].Epoch != 1 {
			t.Fatalf("first join: %+v, %v", a, err)
		}
		b, err := s.JoinMembers(ctx, Member{Rank: 7, Name: "b", Value: []byte("rb")})
		if err != nil || b.Version != 2 || len(b.Members) != 2 || b.Members[1].Name != "b" {
			t.Fatalf("second join: %+v, %v", b, err)
		}
		// A retry of a join that was made is answered, not refused.
		if again, err := s.JoinMembers(ctx, Member{Rank: 7, Name: "b", Value: []byte("rb")}); err != nil || again.Version != 2 {
			t.Fatalf("a retried join: %+v, %v", again, err)
		}
		for _, tc := range []struct {
			m      Member
			byName bool
			holder string
		}{
			{Member{Rank: 7, Name: "c"}, false, "b"},
			{Member{Rank: 3, Name: "a"}, true, "a"},
			{Member{Rank: 7, Name: "b", Value: []byte("another address")}, false, "b"},
		} {
			_, err := s.JoinMembers(ctx, tc.m)
			taken, ok := errors.AsType[*TakenError](err)
			if !ok || taken.ByName != tc.byName || taken.Holder.Name != tc.holder {
				t.Fatalf("join %+v: %v", tc.m, err)
			}
		}
		// A leave names the member's epoch: a later member of the same rank stays.
		if ms, removed, err := s.LeaveMembers(ctx, 7, 1); err != nil || removed || ms.Version != 2 {
			t.Fatalf("leave of a stale epoch: %+v %v %v", ms, removed, err)
		}
		ms, removed, err := s.LeaveMembers(ctx, 7, 2)
		if err != nil || !removed || ms.Version != 3 || len(ms.Members) != 1 {
			t.Fatalf("leave: %+v %v %v", ms, removed, err)
		}
		if back, err := s.JoinMembers(ctx, Member{Rank: 7, Name: "b", Value: []byte("new")}); err != nil || back.Members[1].Epoch != 4 {
			t.Fatalf("join again: %+v, %v", back, err)
		}
		if now, err := s.Members(ctx); err != nil || now.Version != 4 || len(now.Members) != 2 {
			t.Fatalf("members: %+v, %v", now, err)
		}
	})
}

func TestMemberStoreRefusesBadRequests(t *testing.T) {
	ctx := testctx.For(t)
	dynamic := NewMemStore(0)
	for _, m := range []Member{
		{Rank: -1, Name: "a"},
		{Rank: 0, Name: ""},
		{Rank: 0, Name: string(make([]byte, maxWhoBytes+1))},
		{Rank: 0, Name: "a", Value: make([]byte, maxMemberRecordBytes+1)},
	} {
		if _, err := dynamic.JoinMembers(ctx, m); err == nil {
			t.Fatalf("joined %q of rank %d with a %d-byte record", clip(m.Name), m.Rank, len(m.Value))
		}
	}
	if _, err := NewMemStore(3).JoinMembers(ctx, Member{Rank: 0, Name: "a"}); err == nil {
		t.Fatal("a static world's store took a member")
	}
	// Filled in place: joining that many, each answered with the whole membership, is slow.
	dynamic.members.byRank = map[int]Member{}
	for i := range maxMembers {
		dynamic.members.byRank[i] = Member{Rank: i, Name: fmt.Sprint("w", i)}
	}
	if _, err := dynamic.JoinMembers(ctx, Member{Rank: maxMembers, Name: "one-too-many"}); err == nil {
		t.Fatalf("took member %d", maxMembers+1)
	}
}

// A member request that claims gigabytes it does not carry is refused without allocating them.
func TestMemberRequestDecodesIntoBoundedMemory(t *testing.T) {
	// {"member": {"value": <bin32 claiming 3 GB, carrying nothing>}}
	hostile := []byte{0x81, 0xa6}
	hostile = append(hostile, "member"...)
	hostile = append(hostile, 0x81, 0xa5)
	hostile = append(hostile, "value"...)
	hostile = append(hostile, 0xc6, 0xb2, 0xd0, 0x5e, 0x00)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		var req memberRequest
		if err := (msgpackcodec.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(hostile)}, &req); err == nil {
			t.Fatal("decoded a request that claims 3 GB")
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("100 hostile requests allocated %d bytes", grew)
	}
	// And a real one decodes.
	real, err := msgpack.Marshal(&memberRequest{Op: "join", Member: Member{Rank: 3, Name: "w3", Epoch: 9, Value: []byte("addr")}})
	if err != nil {
		t.Fatal(err)
	}
	var req memberRequest
	if err := (msgpackcodec.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(real)}, &req); err != nil || req.Member.Name != "w3" || req.Member.Epoch != 9 || string(req.Member.Value) != "addr" {
		t.Fatalf("a real request: %+v, %v", req, err)
	}
}

package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

const (
	// maxMembers bounds a dynamic world's members, so strangers cannot grow the store's host
	// without bound; it is far beyond any world this project runs (make scale runs 256).
	maxMembers = 1 << 14
	// maxMemberRecordBytes bounds a member's record: a worker's is a name of at most 128
	// bytes, two addresses and a nonce, some hundreds of bytes.
	maxMemberRecordBytes = 4 << 10
	// maxMembershipBytes bounds a whole membership as a client accepts it: every member at
	// its limits, with room for msgpack's keys.
	maxMembershipBytes = maxMembers * (maxMemberRecordBytes + maxWhoBytes + 64)
)

// Member is one worker of a dynamic world, as the store records it.
type Member struct {
	Rank int    `msgpack:"rank"`
	Name string `msgpack:"name"`
	// Epoch is the store's version when the member joined: a worker that leaves and joins
	// again under the same rank is a new member with a new epoch.
	Epoch uint64 `msgpack:"epoch"`
	// Value is the worker's record (its address, for one).
	Value []byte `msgpack:"value"`
}

// Membership is a dynamic world's members, by rank, at one version of the store. Every join
// and every leave makes a new version.
type Membership struct {
	Version uint64   `msgpack:"version"`
	Members []Member `msgpack:"members"`
}

// MemberStore is implemented by stores that hold a dynamic world (one whose size is not fixed,
// torch's world_size=None): workers join and leave one at a time, each change a new version.
type MemberStore interface {
	// JoinMembers adds m (its Epoch is ignored) and returns the membership with it. If m's
	// rank or name is held by another member, it fails with a *TakenError naming it; the
	// same member joining again (a retry) gets the membership it is in.
	JoinMembers(ctx context.Context, m Member) (Membership, error)
	// LeaveMembers removes the member of that rank if it joined at epoch (a later member of
	// the same rank stays), and returns the membership and whether it removed one.
	LeaveMembers(ctx context.Context, rank int, epoch uint64) (Membership, bool, error)
	// Members returns the membership now.
	Members(ctx context.Context) (Membership, error)
}

// TakenError: a worker asked to join a dynamic world under a rank or name another member
// holds.
type TakenError struct {
	Holder Member
	// ByName tells whether the name is held (by a member of another rank); else the rank is.
	ByName bool
}

func (e *TakenError) Error() string {
	if e.ByName {
		return fmt.Sprintf("worker name %q is held by the member of rank %d", e.Holder.Name, e.Holder.Rank)
	}
	return fmt.Sprintf("rank %d is held by member %q", e.Holder.Rank, e.Holder.Name)
}

// memberTable is a MemStore's dynamic world.
type memberTable struct {
	mu      sync.Mutex
	version uint64
	byRank  map[int]Member
}

// dynamic reports whether the store holds a dynamic world (NewMemStore(0)).
func (s *MemStore) dynamic() bool { return s.worldSize == 0 }

func (s *MemStore) checkMember(m Member) error {
	switch {
	case !s.dynamic():
		return fmt.Errorf("this store holds a world of fixed size %d: no worker joins or leaves it one at a time (was world_size given on some workers and not others?)", s.worldSize)
	case m.Rank < 0:
		return fmt.Errorf("rank %d is negative", m.Rank)
	case m.Name == "" || len(m.Name) > maxWhoBytes:
		return fmt.Errorf("a member's name must be 1 to %d bytes, got %s", maxWhoBytes, clip(m.Name))
	case len(m.Value) > maxMemberRecordBytes:
		return fmt.Errorf("member %s sent a record of %d bytes, more than the %d allowed", clip(m.Name), len(m.Value), maxMemberRecordBytes)
	}
	return nil
}

// JoinMembers implements MemberStore.
func (s *MemStore) JoinMembers(_ context.Context, m Member) (Membership, error) {
	if err := s.checkMember(m); err != nil {
		return Membership{}, err
	}
	t := &s.members
	t.mu.Lock()
	defer t.mu.Unlock()
	if held, ok := t.byRank[m.Rank]; ok {
		if held.Name == m.Name && string(held.Value) == string(m.Value) {
			return t.membership(), nil // a retry of a join that was made
		}
		return Membership{}, &TakenError{Holder: held}
	}
	for _, held := range t.byRank {
		if held.Name == m.Name {
			return Membership{}, &TakenError{Holder: held, ByName: true}
		}
	}
	if len(t.byRank) >= maxMembers {
		return Membership{}, fmt.Errorf("the world has %d members, the most this store holds", maxMembers)
	}
	if t.byRank == nil {
		t.byRank = map[int]Member{}
	}
	t.version++
	m.Epoch = t.version
	t.byRank[m.Rank] = m
	return t.membership(), nil
}

// LeaveMembers implements MemberStore.
func (s *MemStore) LeaveMembers(_ context.Context, rank int, epoch uint64) (Membership, bool, error) {
	if !s.dynamic() {
		return Membership{}, false, s.checkMember(Member{})
	}
	t := &s.members
	t.mu.Lock()
	defer t.mu.Unlock()
	held, ok := t.byRank[rank]
	if !ok || held.Epoch != epoch {
		return t.membership(), false, nil
	}
	delete(t.byRank, rank)
	t.version++
	return t.membership(), true, nil
}

// Members implements MemberStore.
func (s *MemStore) Members(context.Context) (Membership, error) {
	if !s.dynamic() {
		return Membership{}, s.checkMember(Member{})
	}
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	return s.members.membership(), nil
}

// membership copies the table, by rank; the mutex is held.
func (t *memberTable) membership() Membership {
	ms := Membership{Version: t.version, Members: make([]Member, 0, len(t.byRank))}
	for _, m := range t.byRank {
		ms.Members = append(ms.Members, m)
	}
	slices.SortFunc(ms.Members, func(a, b Member) int { return a.Rank - b.Rank })
	return ms
}

// memberRequest is a MemberStore call over gRPC.
type memberRequest struct {
	Op     string `msgpack:"op"` // "join", "leave" or "list"
	Member Member `msgpack:"member"`
}

// memberReply answers a memberRequest.
type memberReply struct {
	Membership Membership `msgpack:"membership"`
	Removed    bool       `msgpack:"removed"`
	Taken      *Member    `msgpack:"taken"`
	TakenName  bool       `msgpack:"taken_name"`
}

// DecodeMsgpack reads a memberRequest into bounded memory only, as GatherRequest's does.
func (r *memberRequest) DecodeMsgpack(dec *msgpack.Decoder) error {
	return decodeFields(dec, "member request", func(key string) (err error) {
		switch key {
		case "op":
			r.Op, err = decodeStoreString(dec)
		case "member":
			err = r.Member.decode(dec)
		default:
			err = errors.New("not a field of a member request")
		}
		return err
	})
}

func (m *Member) decode(dec *msgpack.Decoder) error {
	return decodeFields(dec, "member", func(key string) (err error) {
		switch key {
		case "rank":
			m.Rank, err = dec.DecodeInt()
		case "name":
			m.Name, err = decodeStoreString(dec)
		case "epoch":
			m.Epoch, err = dec.DecodeUint64()
		case "value":
			m.Value, err = decodeStoreBytes(dec)
		default:
			err = errors.New("not a field of a member")
		}
		return err
	})
}

// serveMember answers one memberRequest from store.
func serveMember(ctx context.Context, store MemberStore, req memberRequest) (*memberReply, error) {
	var reply memberReply
	var err error
	switch req.Op {
	case "join":
		reply.Membership, err = store.JoinMembers(ctx, req.Member)
		if taken, ok := errors.AsType[*TakenError](err); ok {
			return &memberReply{Taken: &taken.Holder, TakenName: taken.ByName}, nil
		}
	case "leave":
		reply.Membership, reply.Removed, err = store.LeaveMembers(ctx, req.Member.Rank, req.Member.Epoch)
	case "list":
		reply.Membership, err = store.Members(ctx)
	default:
		err = fmt.Errorf("unknown member operation %s", clip(req.Op))
	}
	if err != nil {
		return nil, err
	}
	return &reply, nil
}

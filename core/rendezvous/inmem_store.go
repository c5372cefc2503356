package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Limits on what one request can make a MemStore hold. Rank 0 serves the store to anyone who
// can reach its port (with no token: anyone), so every one is checked before anything is
// allocated or registered.
const (
	// maxLiveRounds bounds the rounds under way at once, besides the project's own. The
	// project's rounds ("join", then the shutdown barrier's) run one after the other; 16 leaves
	// room for rounds added later while bounding what strangers can open to 16 × world size
	// values. The project's own rounds are not counted, so strangers cannot crowd them out.
	maxLiveRounds = 16
	// maxRoundNameBytes bounds a round's name; the project's are a few bytes.
	maxRoundNameBytes = 256
	// maxWhoBytes bounds how a participant names itself: a quoted worker name is at most
	// core.MaxNameLength+2 (130) bytes.
	maxWhoBytes = 512
	// maxStoreValueBytes bounds one participant's value. A worker's record is some tens of
	// bytes (a name of at most 128 bytes and an address); 64 KiB is ample headroom.
	maxStoreValueBytes = 64 << 10
	// finishedRoundsKept bounds how many finished rounds are remembered, so a late joiner is
	// told its round is over instead of opening a new one that never completes.
	finishedRoundsKept = 64
	// maxStoreRequestBytes bounds a whole encoded request: the fields above plus slack for
	// msgpack's keys, the integers and the framing.
	maxStoreRequestBytes = maxRoundNameBytes + maxWhoBytes + maxStoreValueBytes + 1<<10
)

// MemStore is a Store held in this process. It is the state behind the gRPC store that rank 0
// serves, and tests use it directly.
type MemStore struct {
	worldSize int

	mu     sync.Mutex
	rounds map[string]*gatherRound // rounds under way
	// gone holds ranks declared gone in rounds not yet made; at most maxLiveRounds rounds.
	gone map[string]map[int]bool
	// finished remembers the rounds that ended most recently: nil if they completed, or the
	// error that failed them. ring holds their names in the order they ended, so the oldest
	// is forgotten first.
	finished map[string]error
	ring     [finishedRoundsKept]string
	ringNext int
	// completed keeps the project's own rounds that completed, values and all (at most
	// MaxShutdownRounds+2 rounds of world-size records), so a participant whose reply was lost
	// can ask again.
	completed map[string]*gatherRound

	members memberTable // a dynamic world's (worldSize 0); see members.go

	// admitted counts the requests enter took into a round, retries included: tests wait on
	// it to know a request reached the store.
	admitted int

	// closed is set when the host stops serving the store: rounds under way failed then, and
	// no new one opens.
	closed bool
}

// errStoreClosed ends the rounds under way when the store's host leaves: their participants
// hear at once that the store is gone, rather than wait for a host that will not join.
var errStoreClosed = errors.New("the rendezvous store closed: the worker that hosted it left")

type gatherRound struct {
	name   string
	size   int
	who    []string // by rank; "" until that rank joins
	values [][]byte
	joined int // ranks that joined or are gone
	gone   map[int]bool
	err    error
	done   chan struct{}
}

// NewMemStore returns an empty store for a world of worldSize workers; it refuses requests
// for any other size. A worldSize of 0 makes the store of a dynamic world (MemberStore).
func NewMemStore(worldSize int) *MemStore {
	return &MemStore{
		worldSize: worldSize,
		rounds:    map[string]*gatherRound{},
		gone:      map[string]map[int]bool{},
		finished:  map[string]error{},
		completed: map[string]*gatherRound{},
	}
}

// MarkGone counts rank as present in the round, with a nil value, because its worker is gone:
// the others need not wait for it. A rank that already joined is left as it is, and so is a
// round that is over. Only the store's host calls it, but what it records is bounded all the
// same: marks for rounds not yet made are kept for at most maxLiveRounds rounds (the host
// marks again while it waits, so a mark dropped is not lost for good).
func (s *MemStore) MarkGone(round string, rank int) {
	if rank < 0 || rank >= s.worldSize || round == "" || len(round) > maxRoundNameBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rounds[round]; r != nil {
		if r.markGone(rank) {
			s.retire(r)
		}
		return
	}
	if _, over := s.finished[round]; over {
		return
	}
	if s.gone[round] == nil {
		if len(s.gone) >= maxLiveRounds {
			return
		}
		s.gone[round] = map[int]bool{}
	}
	s.gone[round][rank] = true
}

// markGone: see MarkGone; the store's mutex is held. It reports whether the round is now
// complete.
func (r *gatherRound) markGone(rank int) bool {
	if rank < 0 || rank >= r.size || r.who[rank] != "" || r.gone[rank] || r.err != nil {
		return false
	}
	r.gone[rank] = true
	r.joined++
	return r.completeIfFull()
}

// completeIfFull ends the round once every rank joined or is gone; the store's mutex is held.
func (r *gatherRound) completeIfFull() bool {
	if r.joined < r.size {
		return false
	}
	close(r.done)
	return true
}

// fail ends the round with err for everyone; the store's mutex is held.
func (r *gatherRound) fail(err error) {
	r.err = err
	select {
	case <-r.done:
	default:
		close(r.done)
	}
}

// retire drops an ended round from the rounds under way (its waiters hold it already) and
// remembers how it ended; the store's mutex is held.
func (s *MemStore) retire(r *gatherRound) {
	delete(s.rounds, r.name)
	if oldest := s.ring[s.ringNext]; oldest != "" {
		delete(s.finished, oldest)
	}
	s.ring[s.ringNext] = r.name
	s.ringNext = (s.ringNext + 1) % finishedRoundsKept
	s.finished[r.name] = r.err
	if r.err == nil && projectRound(r.name) {
		s.completed[r.name] = r
	}
}

// rejoins reports whether req is a participant entering r again with what it brought the
// first time: a client retrying after its connection broke, not a second worker.
func (r *gatherRound) rejoins(req GatherRequest) bool {
	return r.who[req.Rank] == req.Who && bytes.Equal(r.values[req.Rank], req.Value)
}

// liveRounds is the number of rounds under way; for tests.
func (s *MemStore) liveRounds() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rounds)
}

// clip shortens text from a request for an error message, so a refusal does not echo what it
// refuses.
func clip(text string) string {
	const keep = 32
	if len(text) <= keep {
		return fmt.Sprintf("%q", text)
	}
	return fmt.Sprintf("%q… (%d bytes)", text[:keep], len(text))
}

// check refuses a request that is malformed or over a limit. It looks only at the request's
// fields, allocating nothing by what they claim.
func (s *MemStore) check(req GatherRequest) error {
	switch {
	case req.Round == "":
		return fmt.Errorf("the round name is empty")
	case len(req.Round) > maxRoundNameBytes:
		return fmt.Errorf("round name %s is longer than the %d bytes allowed", clip(req.Round), maxRoundNameBytes)
	case len(req.Who) > maxWhoBytes:
		return fmt.Errorf("round %q: the participant's name %s is longer than the %d bytes allowed", req.Round, clip(req.Who), maxWhoBytes)
	case len(req.Value) > maxStoreValueBytes:
		return fmt.Errorf("round %q: %s sent a value of %d bytes, more than the %d allowed", req.Round, req.Who, len(req.Value), maxStoreValueBytes)
	case req.Size != s.worldSize:
		return fmt.Errorf("round %q: %s joined with world size %d, but this world's size is %d", req.Round, req.Who, req.Size, s.worldSize)
	case req.Rank < 0 || req.Rank >= s.worldSize:
		return fmt.Errorf("round %q: rank %d (%s) is out of range for world size %d", req.Round, req.Rank, req.Who, s.worldSize)
	case req.Who == "":
		// A rank counts as joined by its name being set: a nameless participant could join
		// the same rank over and over and complete the round alone.
		return fmt.Errorf("round %q: rank %d did not name itself", req.Round, req.Rank)
	}
	return nil
}

// enter admits req to its round without waiting: it checks the request, opens the round if
// it is new and records the participant. A request for another world size is refused to its
// sender alone: the store knows the world's size from its host's config, so it is the request
// that is wrong, not the round, and one stray or hostile request must not fail a round the
// real world can still complete. (Before the store knew the size, a mismatch failed the round
// for everyone, as either side could be the wrong one; no test relies on that.) The others
// wait for the rank that never came, and their timeout names it. A duplicate rank still fails
// the round for everyone: no one can tell which of the two is the real one. The same
// participant again, with the same value, is a client retrying after its connection broke:
// it waits with the round, or gets the values of a project round that completed.
func (s *MemStore) enter(req GatherRequest) (*gatherRound, error) {
	if err := s.check(req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rounds[req.Round]
	if r == nil {
		if done := s.completed[req.Round]; done != nil && done.rejoins(req) {
			return done, nil
		}
		if s.closed {
			return nil, fmt.Errorf("round %q: %w", req.Round, errStoreClosed)
		}
		if err, over := s.finished[req.Round]; over {
			if err != nil {
				return nil, err // what it would have heard had it come in time
			}
			return nil, fmt.Errorf("round %q is already over: %s came after every rank had joined or was gone", req.Round, req.Who)
		}
		if !projectRound(req.Round) && s.liveOthers() >= maxLiveRounds {
			return nil, fmt.Errorf("round %q: %d rounds are under way already, the most this store holds", req.Round, maxLiveRounds)
		}
		r = &gatherRound{
			name: req.Round, size: s.worldSize, gone: map[int]bool{}, done: make(chan struct{}),
			who: make([]string, s.worldSize), values: make([][]byte, s.worldSize),
		}
		s.rounds[req.Round] = r
		for rank := range s.gone[req.Round] {
			r.markGone(rank)
		}
		delete(s.gone, req.Round)
	}
	s.admitted++
	switch {
	case r.err != nil:
	case r.rejoins(req): // it waits with the round again
	case r.who[req.Rank] != "":
		r.fail(fmt.Errorf("round %q: rank %d was taken by both %s and %s", req.Round, req.Rank, r.who[req.Rank], req.Who))
	case r.gone[req.Rank]: // declared gone, but here after all: too late to change the round
	default:
		r.who[req.Rank] = req.Who
		r.values[req.Rank] = req.Value
		r.joined++
		r.completeIfFull()
	}
	select {
	case <-r.done:
		s.retire(r)
	default:
	}
	return r, nil
}

// liveOthers counts the rounds under way other than the project's own; the mutex is held.
func (s *MemStore) liveOthers() int {
	n := len(s.rounds)
	for name := range s.rounds {
		if projectRound(name) {
			n--
		}
	}
	return n
}

// Gather implements Store. A round fails for every participant as soon as one joins it with a
// rank already taken, so no one waits for a world that cannot form; see enter for what is
// refused to its sender alone.
func (s *MemStore) Gather(ctx context.Context, req GatherRequest) ([][]byte, error) {
	r, err := s.enter(req)
	if err != nil {
		return nil, err
	}
	var timeout <-chan time.Time
	if d := req.wait(); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("round %q: %w", req.Round, ctx.Err())
	case <-timeout:
		s.mu.Lock()
		missing := missingRanks(r.size, r.who)
		s.mu.Unlock()
		return nil, fmt.Errorf("round %q timed out after %v: ranks %s of world size %d never joined", req.Round, req.wait(), missing, r.size)
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.values, nil
}

// Close implements Store; a MemStore holds nothing to release. (Tests' workers share one
// MemStore, so closing it as one of them must not end the others' rounds; stopServing does
// that for the store's host.)
func (s *MemStore) Close() error { return nil }

// stopServing fails every round under way with errStoreClosed and refuses new ones; a
// participant retrying a project round that completed still gets its values.
func (s *MemStore) stopServing() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, r := range s.rounds {
		r.fail(fmt.Errorf("round %q: %w; ranks %s of world size %d never joined", r.name, errStoreClosed, missingRanks(r.size, r.who), r.size))
		s.retire(r)
	}
}

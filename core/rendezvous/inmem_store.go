package rendezvous

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// MemStore is a Store held in this process. It is the state behind the gRPC store that rank 0
// serves, and tests use it directly.
type MemStore struct {
	mu     sync.Mutex
	rounds map[string]*gatherRound
	gone   map[string]map[int]bool // ranks declared gone, by round, for rounds not yet made
}

type gatherRound struct {
	size   int
	who    []string // by rank; "" until that rank joins
	values [][]byte
	joined int // ranks that joined or are gone
	gone   map[int]bool
	err    error
	done   chan struct{}
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{rounds: map[string]*gatherRound{}, gone: map[string]map[int]bool{}}
}

// MarkGone counts rank as present in the round, with a nil value, because its worker is gone:
// the others need not wait for it. A rank that already joined is left as it is.
func (s *MemStore) MarkGone(round string, rank int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rounds[round]
	if r == nil {
		if s.gone[round] == nil {
			s.gone[round] = map[int]bool{}
		}
		s.gone[round][rank] = true
		return
	}
	r.markGone(rank)
}

// markGone: see MarkGone; the store's mutex is held.
func (r *gatherRound) markGone(rank int) {
	if rank < 0 || rank >= r.size || r.who[rank] != "" || r.gone[rank] || r.err != nil {
		return
	}
	r.gone[rank] = true
	r.joined++
	if r.joined == r.size {
		close(r.done)
	}
}

// Gather implements Store. A round fails for every participant as soon as one joins it wrongly
// (a duplicate rank or a different size), so no one waits for a world that cannot form.
func (s *MemStore) Gather(ctx context.Context, req GatherRequest) ([][]byte, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	r := s.rounds[req.Round]
	if r == nil {
		r = &gatherRound{size: req.Size, who: make([]string, req.Size), values: make([][]byte, req.Size), gone: map[int]bool{}, done: make(chan struct{})}
		s.rounds[req.Round] = r
		for rank := range s.gone[req.Round] {
			r.markGone(rank)
		}
		delete(s.gone, req.Round)
	}
	switch {
	case r.err != nil:
	case r.size != req.Size:
		r.fail(fmt.Errorf("round %q: %s joined with world size %d but others use %d", req.Round, req.Who, req.Size, r.size))
	case r.who[req.Rank] != "":
		r.fail(fmt.Errorf("round %q: rank %d was taken by both %s and %s", req.Round, req.Rank, r.who[req.Rank], req.Who))
	case r.gone[req.Rank]: // declared gone, but here after all: too late to change the round
	default:
		r.who[req.Rank] = req.Who
		r.values[req.Rank] = req.Value
		r.joined++
		if r.joined == r.size {
			close(r.done)
		}
	}
	s.mu.Unlock()

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

// fail ends the round with err for everyone; the store's mutex is held.
func (r *gatherRound) fail(err error) {
	r.err = err
	select {
	case <-r.done:
	default:
		close(r.done)
	}
}

// Close implements Store; a MemStore holds nothing to release.
func (s *MemStore) Close() error { return nil }

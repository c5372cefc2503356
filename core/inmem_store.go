package core

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
}

type gatherRound struct {
	size   int
	who    []string // by rank; "" until that rank joins
	values [][]byte
	joined int
	err    error
	done   chan struct{}
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore { return &MemStore{rounds: map[string]*gatherRound{}} }

// Gather implements Store. A round fails for every participant as soon as one joins it wrongly
// (a duplicate rank or a different size), so no one waits for a world that cannot form.
func (s *MemStore) Gather(ctx context.Context, req GatherRequest) ([][]byte, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	r := s.rounds[req.Round]
	if r == nil {
		r = &gatherRound{size: req.Size, who: make([]string, req.Size), values: make([][]byte, req.Size), done: make(chan struct{})}
		s.rounds[req.Round] = r
	}
	switch {
	case r.err != nil:
	case r.size != req.Size:
		r.fail(fmt.Errorf("round %q: %s joined with world size %d but others use %d", req.Round, req.Who, req.Size, r.size))
	case r.who[req.Rank] != "":
		r.fail(fmt.Errorf("round %q: rank %d was taken by both %s and %s", req.Round, req.Rank, r.who[req.Rank], req.Who))
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

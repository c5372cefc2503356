package core

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/vmihailenco/msgpack/v5"
)

// join publishes self in the store and returns every worker of the world, indexed by id.
func join(ctx context.Context, store rendezvous.Store, self WorkerInfo, worldSize int, wait time.Duration) ([]WorkerInfo, error) {
	value, err := msgpack.Marshal(&self)
	if err != nil {
		return nil, err
	}
	values, err := store.Gather(ctx, rendezvous.GatherRequest{
		Round: rendezvous.JoinRound, Rank: self.ID, Size: worldSize, Who: fmt.Sprintf("%q", self.Name), Value: value, WaitMs: wait.Milliseconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRendezvous, err)
	}
	// The records come from the store and from every worker: check them before the agent
	// indexes anything by them.
	if len(values) != worldSize {
		return nil, fmt.Errorf("%w: the store returned %d worker records for a world of %d", ErrRendezvous, len(values), worldSize)
	}
	workers := make([]WorkerInfo, worldSize)
	byName := map[string]int{}
	for rank, v := range values {
		if err := msgpack.Unmarshal(v, &workers[rank]); err != nil {
			return nil, fmt.Errorf("%w: rank %d sent a bad worker record: %w", ErrRendezvous, rank, err)
		}
		w := workers[rank]
		if w.ID != rank {
			return nil, fmt.Errorf("%w: rank %d registered as rank %d", ErrRendezvous, rank, w.ID)
		}
		if err := ValidateName(w.Name); err != nil {
			return nil, fmt.Errorf("%w: rank %d: %w", ErrRendezvous, rank, err)
		}
		if other, dup := byName[w.Name]; dup {
			return nil, &DuplicateNameError{Name: w.Name, First: other, Later: rank}
		}
		byName[w.Name] = rank
	}
	return workers, nil
}

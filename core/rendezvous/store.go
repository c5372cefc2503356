// Package rendezvous is how the workers of a world find each other: a Store where each
// publishes its record and waits for everyone's (a gather round), also used for the shutdown
// barrier. Rank 0 serves a MemStore over gRPC (ServeStore, DialStore); FileStore is a file
// every worker opens, for worlds on one machine.
package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Store is the rendezvous service of a world: rank 0 hosts it, every agent uses it to join the
// world and for barriers.
type Store interface {
	// Gather publishes value as rank's contribution to the named round of size participants
	// and waits, at most wait, until all have contributed; it returns the values by rank.
	// who names the caller in errors.
	Gather(ctx context.Context, req GatherRequest) ([][]byte, error)
	// Close releases the store; a hosting store stops serving.
	Close() error
}

// GoneMarker is implemented by stores that can count a participant as present, with no value,
// because its worker is gone: the host of a MemStore marks workers that stopped answering,
// so a barrier does not wait for them.
type GoneMarker interface {
	MarkGone(round string, rank int)
}

// Leaver is implemented by stores that must hear a worker leave the world (a FileStore's last
// worker removes its file).
type Leaver interface {
	Leave(rank, worldSize int) error
}

// ErrStoreGone: a round that had to fail fast found the store unreachable.
var ErrStoreGone = errors.New("rendezvous store is gone")

// GatherRequest is one participant's contribution to a round.
type GatherRequest struct {
	Round string `msgpack:"round"`
	Rank  int    `msgpack:"rank"`
	Size  int    `msgpack:"size"`
	Who   string `msgpack:"who"`
	Value []byte `msgpack:"value"`
	// WaitMs bounds how long the store waits for the rest of the round.
	WaitMs int64 `msgpack:"wait_ms"`
	// FailFast makes a remote store's client give up at once if the store cannot be reached,
	// instead of retrying until the deadline (a store that is gone will not come back).
	FailFast bool `msgpack:"-"`
}

func (r GatherRequest) validate() error {
	if r.Size <= 0 {
		return fmt.Errorf("round %q: world size must be positive, got %d", r.Round, r.Size)
	}
	if r.Rank < 0 || r.Rank >= r.Size {
		return fmt.Errorf("round %q: rank %d (%s) is out of range for world size %d", r.Round, r.Rank, r.Who, r.Size)
	}
	return nil
}

func (r GatherRequest) wait() time.Duration {
	if r.WaitMs <= 0 {
		return 0
	}
	return time.Duration(r.WaitMs) * time.Millisecond
}

// missingRanks lists the ranks in [0, size) absent from joined.
func missingRanks(size int, joined []string) string {
	var missing []string
	for r := 0; r < size; r++ {
		if joined[r] == "" {
			missing = append(missing, fmt.Sprint(r))
		}
	}
	return "[" + strings.Join(missing, " ") + "]"
}

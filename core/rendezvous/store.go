// Package rendezvous is how the workers of a world find each other: a Store where each
// publishes its record and waits for everyone's (a gather round), also used for the shutdown
// barrier. Rank 0 serves a MemStore over gRPC (ServeStore, DialStore); FileStore is a file
// every worker opens, for worlds on one machine.
package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The rounds a world's agents hold: every worker publishes itself in JoinRound, and graceful
// shutdown is a barrier of rounds ShutdownRound, ShutdownRoundN(1), … (see core's drain).
const (
	JoinRound     = "join"
	ShutdownRound = "shutdown"
	// MaxShutdownRounds bounds the barrier's rounds; a world still busy after that many leaves.
	MaxShutdownRounds = 32
)

// ShutdownRoundN names the n-th round of the shutdown barrier (ShutdownRound for 0).
func ShutdownRoundN(n int) string {
	if n == 0 {
		return ShutdownRound
	}
	return fmt.Sprintf("%s.%d", ShutdownRound, n)
}

// projectRound reports whether round is one the project itself runs; those are exempt from
// the store's limit on live rounds (there are at most MaxShutdownRounds+1 of them).
func projectRound(round string) bool {
	if round == JoinRound || round == ShutdownRound {
		return true
	}
	n, ok := strings.CutPrefix(round, ShutdownRound+".")
	if !ok {
		return false
	}
	k, err := strconv.Atoi(n)
	return err == nil && k > 0 && k < MaxShutdownRounds && ShutdownRoundN(k) == round
}

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

// DecodeMsgpack reads what the default encoder writes for a GatherRequest (a map keyed by the
// msgpack tags), but never allocates by a length the data merely claims: msgpack's own
// decoder makes a []byte as long as its header says, so a request of a dozen bytes claiming a
// 2 GiB value cost the store's host 2 GiB. No field of a real request comes near
// maxStoreRequestBytes, which is also the most the store's gRPC server accepts; a field it
// does not know is refused.
func (r *GatherRequest) DecodeMsgpack(dec *msgpack.Decoder) error {
	return decodeFields(dec, "store request", func(key string) (err error) {
		switch key {
		case "round":
			r.Round, err = decodeStoreString(dec)
		case "rank":
			r.Rank, err = dec.DecodeInt()
		case "size":
			r.Size, err = dec.DecodeInt()
		case "who":
			r.Who, err = decodeStoreString(dec)
		case "value":
			r.Value, err = decodeStoreBytes(dec)
		case "wait_ms":
			r.WaitMs, err = dec.DecodeInt64()
		default:
			// Every worker of a world runs the same version, so an unknown field is hostile;
			// skipping it would let msgpack read a claimed length in 1 MiB steps.
			err = errors.New("not a field of a store request")
		}
		return err
	})
}

// decodeFields reads a msgpack map keyed by bounded strings, what it is named in errors;
// field reads the value of each key.
func decodeFields(dec *msgpack.Decoder, what string, field func(key string) error) error {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return err
	}
	for range n {
		key, err := decodeStoreBytes(dec)
		if err != nil {
			return fmt.Errorf("%s: a key: %w", what, err)
		}
		if err := field(string(key)); err != nil {
			return fmt.Errorf("%s: field %s: %w", what, clip(string(key)), err)
		}
	}
	return nil
}

// decodeStoreBytes reads a string or byte string of at most maxStoreRequestBytes.
func decodeStoreBytes(dec *msgpack.Decoder) ([]byte, error) {
	n, err := dec.DecodeBytesLen()
	if err != nil || n < 0 {
		return nil, err
	}
	if n > maxStoreRequestBytes {
		return nil, fmt.Errorf("it claims %d bytes, more than a whole store request may hold (%d)", n, maxStoreRequestBytes)
	}
	b := make([]byte, n)
	if err := dec.ReadFull(b); err != nil {
		return nil, err
	}
	return b, nil
}

func decodeStoreString(dec *msgpack.Decoder) (string, error) {
	b, err := decodeStoreBytes(dec)
	return string(b), err
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
	switch {
	case r.WaitMs <= 0:
		return 0
	case r.WaitMs > math.MaxInt64/int64(time.Millisecond):
		return math.MaxInt64 // a wait beyond int64 nanoseconds must not wrap to a short one
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

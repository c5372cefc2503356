package core

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultReceiveBudget returns the reassembly budget used when Config.ReceiveBudget is 0: a
// quarter of this machine's memory, and never less than the largest message allowed, so every
// message the size limit admits can be received.
func DefaultReceiveBudget(maxMessageSize int64) int64 {
	var info syscall.Sysinfo_t
	budget := int64(2 << 30)
	if syscall.Sysinfo(&info) == nil && info.Totalram > 0 {
		budget = int64(info.Totalram) * int64(info.Unit) / 4
	}
	return max(budget, maxMessageSize)
}

// receiveBudgetEnv names the environment variable that sets the receive budget of workers
// whose Config leaves it 0 (Python workers among them).
const receiveBudgetEnv = "TENSORPLAY_RPC_RECEIVE_BUDGET"

// receiveBudgetFromEnv reads the budget from the environment: 0 if it is not set.
func receiveBudgetFromEnv(getenv func(string) string) (int64, error) {
	v := getenv(receiveBudgetEnv)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive number of bytes", receiveBudgetEnv, v)
	}
	return n, nil
}

// idleReservationLimit is how long a message may hold receive budget without a chunk arriving
// while another waits for room: an honest sender's chunks arrive every few milliseconds, so a
// message that stalls that long is starving the others (a peer that announces big messages
// and sends nothing would otherwise hold the budget for as long as it likes).
const idleReservationLimit = 2 * time.Second

// receiveBudget bounds the memory of big messages being reassembled, across every stream of
// an agent. A message that does not fit waits for room on its stream's reader, which stops
// reading that stream, so transport flow control slows its sender instead of memory growing.
type receiveBudget struct {
	limit     int64
	idleLimit time.Duration
	log       *slog.Logger

	mu      sync.Mutex
	used    int64
	holders map[*reservation]struct{}
	changed chan struct{} // closed and replaced whenever memory is returned
}

// reservation is the budget one message holds while it is received.
type reservation struct {
	n      int64
	peer   string
	active atomic.Int64 // when a chunk last arrived (unix nanoseconds)
	// evicted is set when the budget took the memory back from a stalled message; the stream
	// that carries it is dropped at its next frame.
	evicted atomic.Bool
}

// touch records that a chunk of the reserved message arrived.
func (r *reservation) touch() { r.active.Store(time.Now().UnixNano()) }

func newReceiveBudget(limit int64, log *slog.Logger) *receiveBudget {
	return &receiveBudget{limit: limit, idleLimit: idleReservationLimit, log: log, holders: map[*reservation]struct{}{}, changed: make(chan struct{})}
}

// reserve takes n bytes for a message from peer, waiting until they fit or ctx ends. While it
// waits, messages that hold memory and have stalled past the idle limit lose it.
func (b *receiveBudget) reserve(ctx context.Context, n int64, peer string) (*reservation, error) {
	if n > b.limit {
		return nil, fmt.Errorf("%w: %d bytes are more than this worker's whole %d-byte receive budget", ErrTooLarge, n, b.limit)
	}
	var tick <-chan time.Time
	for {
		if r := b.tryReserve(n, 0, peer); r != nil {
			return r, nil
		}
		b.mu.Lock()
		changed := b.changed
		b.mu.Unlock()
		if tick == nil {
			t := time.NewTicker(b.idleLimit / 4)
			defer t.Stop()
			tick = t.C
		}
		select {
		case <-changed:
		case <-tick:
			b.evictIdle()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// tryReserve takes n bytes for a message from peer if they fit at once, or if they fit within
// overdraft bytes over the limit; it returns nil if they do not.
func (b *receiveBudget) tryReserve(n, overdraft int64, peer string) *reservation {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit+overdraft-b.used {
		return nil
	}
	b.used += n
	r := &reservation{n: n, peer: peer}
	r.touch()
	b.holders[r] = struct{}{}
	return r
}

// free returns r's bytes, unless they were taken back already.
func (b *receiveBudget) free(r *reservation) {
	if r == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, held := b.holders[r]; !held {
		return
	}
	delete(b.holders, r)
	b.release(r.n)
}

// release returns n bytes and wakes waiters; b.mu is held.
func (b *receiveBudget) release(n int64) {
	b.used -= n
	close(b.changed)
	b.changed = make(chan struct{})
}

// evictIdle takes the memory back from messages no chunk has reached for the idle limit.
func (b *receiveBudget) evictIdle() {
	stale := time.Now().Add(-b.idleLimit).UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := range b.holders {
		if r.active.Load() < stale {
			r.evicted.Store(true)
			delete(b.holders, r)
			b.release(r.n)
			b.log.Warn("tensorplay-rpc: took back receive budget from a message that stalled while others waited; its stream will be dropped", "peer", r.peer, "bytes", r.n, "idle_limit", b.idleLimit.String())
		}
	}
}

// inUse is the number of bytes reserved.
func (b *receiveBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

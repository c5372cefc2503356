package core

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
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

// idleReservationLimit is how long a stream holding receive budget may go without a single
// frame, while another waits for room and this worker is not itself holding the stream up,
// before its messages lose their memory. An honest sender's frames arrive every few
// milliseconds; a peer that announces big messages and then says nothing would otherwise hold
// the budget for as long as it likes.
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

// holder is the stream a reservation's message arrives on.
type holder interface {
	// stalled reports whether the stream has had no frame since stale (unix nanoseconds)
	// and is not being held up by this worker.
	stalled(stale int64) bool
}

// reservation is the budget one message holds while it is received.
type reservation struct {
	n      int64
	peer   string
	holder holder
	// evict frees the message's memory and marks it so its stream is dropped at its next
	// frame; it reports false if it cannot now (a chunk is being written into it).
	evict func() bool
}

func newReceiveBudget(limit int64, log *slog.Logger) *receiveBudget {
	return &receiveBudget{limit: limit, idleLimit: idleReservationLimit, log: log, holders: map[*reservation]struct{}{}, changed: make(chan struct{})}
}

// reserve takes n bytes for r, waiting until they fit or ctx ends. While it waits, messages of
// streams that have stalled past the idle limit lose their memory.
func (b *receiveBudget) reserve(ctx context.Context, r *reservation) error {
	if r.n > b.limit {
		return fmt.Errorf("%w: %d bytes are more than this worker's whole %d-byte receive budget", ErrTooLarge, r.n, b.limit)
	}
	var tick <-chan time.Time
	for {
		ok, changed := b.take(r, 0)
		if ok {
			return nil
		}
		if tick == nil {
			t := time.NewTicker(b.idleLimit / 4)
			defer t.Stop()
			tick = t.C
		}
		select {
		case <-changed:
		case <-tick:
			b.evictStalled()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryReserve takes n bytes for r if they fit at once, or within overdraft bytes over the limit.
func (b *receiveBudget) tryReserve(r *reservation, overdraft int64) bool {
	ok, _ := b.take(r, overdraft)
	return ok
}

// take is tryReserve that, when the bytes do not fit, returns the channel closed at the next
// return of memory, read under the same lock so no return is missed.
func (b *receiveBudget) take(r *reservation, overdraft int64) (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.n > b.limit+overdraft-b.used {
		return false, b.changed
	}
	b.used += r.n
	b.holders[r] = struct{}{}
	return true, nil
}

// free returns r's bytes, unless they were taken back already. It must not be called with
// the holder's own lock held (evictStalled takes that lock under the budget's).
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

// evictStalled takes the memory back from messages of stalled streams.
func (b *receiveBudget) evictStalled() {
	stale := time.Now().Add(-b.idleLimit).UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := range b.holders {
		if r.holder != nil && r.holder.stalled(stale) && r.evict() {
			delete(b.holders, r)
			b.release(r.n)
			b.log.Warn("tensorplay-rpc: took back receive budget from a stream that stalled while others waited; it will be dropped", "peer", r.peer, "bytes", r.n, "idle_limit", b.idleLimit.String())
		}
	}
}

// inUse is the number of bytes reserved.
func (b *receiveBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

package core

import (
	"context"
	"fmt"
	"sync"
	"syscall"
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

// receiveBudget bounds the memory of big messages being reassembled, across every stream of
// an agent. A message that does not fit waits for room on its stream's reader, which stops
// reading that stream, so transport flow control slows its sender instead of memory growing.
type receiveBudget struct {
	limit int64

	mu      sync.Mutex
	used    int64
	changed chan struct{} // closed and replaced whenever memory is returned
}

func newReceiveBudget(limit int64) *receiveBudget {
	return &receiveBudget{limit: limit, changed: make(chan struct{})}
}

// reserve takes n bytes, waiting until they fit or ctx ends.
func (b *receiveBudget) reserve(ctx context.Context, n int64) error {
	if n > b.limit {
		return fmt.Errorf("%w: %d bytes are more than this worker's whole %d-byte receive budget", ErrTooLarge, n, b.limit)
	}
	for {
		b.mu.Lock()
		if n <= b.limit-b.used {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryReserve takes n bytes if they fit at once, or if they fit within overdraft bytes over the
// limit when overdraft is positive.
func (b *receiveBudget) tryReserve(n, overdraft int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit+overdraft-b.used {
		return false
	}
	b.used += n
	return true
}

// free returns n bytes.
func (b *receiveBudget) free(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// inUse is the number of bytes reserved.
func (b *receiveBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Package bufpool keeps large byte buffers for reuse. Fresh memory is expensive (the first
// touch of each page costs a fault), so big messages are received into buffers that have been
// used before.
package bufpool

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

const (
	minClass = 16 // 64 KiB: smaller buffers are cheap to allocate
	maxClass = 33 // 8 GiB
	// MinPooled is the size from which a buffer is worth taking from the pool: a fresh one
	// that size for every message had Go's garbage collector run every few calls.
	MinPooled = 1 << minClass
	// MaxIdle bounds the bytes kept idle in the pool.
	MaxIdle = 1 << 30
)

// Shared is the pool a worker's received messages live in: big messages reassembled from
// chunks (core) and the long payloads and buffers of frames decoded whole (wire).
var Shared Pool

// Pool is a set of free buffers by power-of-two size class. The zero value is ready to use.
type Pool struct {
	mu   sync.Mutex
	free [maxClass + 1][][]byte
	idle int
}

func class(n int) int {
	if n <= 1<<minClass {
		return minClass
	}
	return bits.Len(uint(n - 1))
}

// Get returns a buffer of length n, reused if one of its class is free. Its contents are
// whatever the last user left.
func (p *Pool) Get(n int) []byte {
	c := class(n)
	if c > maxClass {
		return make([]byte, n)
	}
	p.mu.Lock()
	if k := len(p.free[c]); k > 0 {
		b := p.free[c][k-1]
		p.free[c] = p.free[c][:k-1]
		p.idle -= cap(b)
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<c)
}

// Put returns a buffer from Get to the pool; a buffer that would overfill it is left to the
// garbage collector.
func (p *Pool) Put(b []byte) {
	c := class(cap(b))
	if c > maxClass || cap(b) != 1<<c {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle+cap(b) > MaxIdle {
		return
	}
	p.free[c] = append(p.free[c], b[:cap(b)])
	p.idle += cap(b)
}

// PutOnce returns a function that puts bufs back on its first call only: a buffer put back
// twice would be handed to two later users at once.
func (p *Pool) PutOnce(bufs ...[]byte) func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			for _, b := range bufs {
				p.Put(b)
			}
		}
	}
}

// Idle is the number of bytes kept free.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idle
}

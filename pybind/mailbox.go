package pybind

import (
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/futex"
)

// mailbox is a queue that Python threads wait on in a futex rather than on a channel. A
// Python thread in Go is locked to its goroutine: woken through a channel, Go's scheduler hands
// the waker's P to that thread and parks the waker, two context switches more per wake-up
// (expensive on a VM); a futex wakes the sleeping thread directly.
type mailbox[T any] struct {
	ch       chan *T
	bell     atomic.Uint32 // bumped for every item put while someone sleeps
	sleepers atomic.Int32
	closed   chan struct{}
}

func newMailbox[T any](size int, closed chan struct{}) *mailbox[T] {
	return &mailbox[T]{ch: make(chan *T, size), closed: closed}
}

// ring wakes one sleeper, if any, after an item was put into ch.
func (m *mailbox[T]) ring() {
	if m.sleepers.Load() > 0 {
		m.bell.Add(1)
		futex.Wake(&m.bell, 1)
	}
}

// ringAll wakes every sleeper (the mailbox is closing).
func (m *mailbox[T]) ringAll() {
	m.bell.Add(1)
	futex.WakeAll(&m.bell)
}

// tryPut puts v if there is room.
func (m *mailbox[T]) tryPut(v *T) bool {
	select {
	case m.ch <- v:
		m.ring()
		return true
	default:
		return false
	}
}

// take returns the next item, waiting at most timeoutMs and not past closed; nil if none came.
func (m *mailbox[T]) take(timeoutMs int) *T {
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		seen := m.bell.Load()
		m.sleepers.Add(1)
		select {
		case v := <-m.ch:
			m.sleepers.Add(-1)
			return v
		case <-m.closed:
			m.sleepers.Add(-1)
			return nil
		default:
		}
		left := time.Until(deadline)
		if left > 0 {
			futex.Sleep(&m.bell, seen, left)
		}
		m.sleepers.Add(-1)
		if left <= 0 {
			select {
			case v := <-m.ch:
				return v
			default:
				return nil
			}
		}
	}
}

// signal is one event a Python thread waits for in a futex (see mailbox).
type signal struct{ state atomic.Uint32 }

const (
	signalIdle = iota
	signalFired
	signalWaited
)

// fire sets the signal and wakes its waiter.
func (s *signal) fire() {
	if s.state.Swap(signalFired) == signalWaited {
		futex.WakeAll(&s.state)
	}
}

// wait waits up to d for the signal; it reports whether it fired.
func (s *signal) wait(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		st := s.state.Load()
		if st == signalFired {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		if st == signalIdle && !s.state.CompareAndSwap(signalIdle, signalWaited) {
			continue
		}
		futex.Sleep(&s.state, signalWaited, left)
	}
}

package pybind

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/futex"
)

// mailbox is a queue that Python threads wait on, first in a futex, then on a channel. A
// Python thread in Go is locked to its goroutine: woken through a channel, Go's scheduler hands
// the waker's P to that thread and parks the waker, two context switches more per wake-up
// (expensive on a VM); a futex wakes the sleeping thread directly. But a thread asleep in a
// futex keeps its P, which Go's sysmon must take back (polling every 20 us while it does), so
// only the first hotWait of a wait is spent in the futex; an idle thread then waits on a
// channel, without a P. An item goes to a thread in its futex first, so the threads that keep
// busy keep the work.
type mailbox[T any] struct {
	mu    sync.Mutex
	items []*T
	// hot and cold are the waiting threads, in the futex and on channels. put takes one
	// off its list as it wakes it, so each item wakes a thread of its own.
	hot  []*hotWaiter
	cold []chan struct{}
	// closed, once closed, ends every wait.
	closed chan struct{}
}

func newMailbox[T any](closed chan struct{}) *mailbox[T] {
	return &mailbox[T]{closed: closed}
}

// hotWaiter is a thread asleep in its futex word until put sets it.
type hotWaiter struct{ woken atomic.Uint32 }

func (w *hotWaiter) wake() {
	w.woken.Store(1)
	futex.Wake(&w.woken, 1)
}

// hotWait is how long a Python thread waits in a futex before it waits without a P.
const hotWait = 2 * time.Millisecond

// put queues v and wakes one waiting thread. It never blocks: the core bounds the calls each
// caller has in service, and so the requests queued here.
func (m *mailbox[T]) put(v *T) {
	m.mu.Lock()
	m.items = append(m.items, v)
	switch {
	case len(m.hot) > 0:
		w := m.hot[len(m.hot)-1]
		m.hot = m.hot[:len(m.hot)-1]
		m.mu.Unlock()
		w.wake()
	case len(m.cold) > 0:
		c := m.cold[len(m.cold)-1]
		m.cold = m.cold[:len(m.cold)-1]
		m.mu.Unlock()
		c <- struct{}{} // buffered: never blocks
	default:
		m.mu.Unlock()
	}
}

// pop takes the next item; m.mu is held.
func (m *mailbox[T]) pop() *T {
	if len(m.items) == 0 {
		return nil
	}
	v := m.items[0]
	m.items[0] = nil
	m.items = m.items[1:]
	if len(m.items) == 0 {
		m.items = nil // let the backing array go
	}
	return v
}

// wakeAll wakes every waiting thread (the mailbox is closing).
func (m *mailbox[T]) wakeAll() {
	m.mu.Lock()
	hot, cold := m.hot, m.cold
	m.hot, m.cold = nil, nil
	m.mu.Unlock()
	for _, w := range hot {
		w.wake()
	}
	for _, c := range cold {
		c <- struct{}{}
	}
}

// take returns the next item, waiting at most timeoutMs and not past closed; nil if none came.
func (m *mailbox[T]) take(timeoutMs int) *T {
	d := time.Duration(timeoutMs) * time.Millisecond
	start := time.Now()
	hotUntil := start.Add(min(d, hotWait))
	for {
		m.mu.Lock()
		if v := m.pop(); v != nil {
			m.mu.Unlock()
			return v
		}
		left := time.Until(hotUntil)
		if left <= 0 || isClosed(m.closed) {
			break // with m.mu held
		}
		w := &hotWaiter{}
		m.hot = append(m.hot, w)
		m.mu.Unlock()
		futex.Sleep(&w.woken, 0, left)
		m.mu.Lock()
		if i := slices.Index(m.hot, w); i >= 0 { // timed out: no put chose it
			m.hot = slices.Delete(m.hot, i, i+1)
		}
		m.mu.Unlock()
	}
	rest := d - time.Since(start)
	if rest <= 0 || isClosed(m.closed) {
		m.mu.Unlock()
		return nil
	}
	woken := make(chan struct{}, 1)
	m.cold = append(m.cold, woken)
	m.mu.Unlock()
	t := time.NewTimer(rest)
	defer t.Stop()
	select {
	case <-woken:
	case <-m.closed:
	case <-t.C:
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := slices.Index(m.cold, woken); i >= 0 {
		m.cold = slices.Delete(m.cold, i, i+1)
	}
	// Whatever woke this thread, an item may be waiting: a put that chose it must not be lost.
	return m.pop()
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
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

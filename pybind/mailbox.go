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
// only the first hotWait of a wait is spent in the futex, and only by a thread back from an
// item (work comes in bursts); an idle thread waits on a channel, without a P. An idle process
// so wakes no thread but for its timers: each futex wait of an idle thread had sysmon poll for
// a millisecond (measured: 16 pool threads with 2 s waits cost an idle worker ~50 wake-ups a
// second). An item goes to a thread in its futex first, so the threads that keep busy keep
// the work.
//
// While a thread is busy with an item, or woken for one and not yet there, a new item waits
// for it rather than waking another: handlers are mostly short, and a second thread would
// only wake to queue for the GIL (measured on the callee of remote()+to_here(): 10 context
// switches per cycle before, 6.5 after; 64 rpc_async calls in flight: 8,500 calls/s before,
// 20,000 after). If no thread takes an item for stallAfter, the busy ones are taken to be
// blocked (a handler sleeping, or waiting on a call) and one more thread is woken, and so on
// while items wait.
//
// A thread in its futex may instead read a stream for itself while it waits (read: the
// requests' mailbox reads the stream of the caller served last, core.Agent.ServeReading): the
// caller's request then wakes this thread, which queues the item and takes it, where the
// stream's reader goroutine would have woken and queued it for a thread it wakes in turn. An
// item goes first to a thread so reading, as it is the one that read it.
type mailbox[T any] struct {
	mu    sync.Mutex
	items []*T
	// hot and cold are the waiting threads, in the futex and on channels. A wake takes one
	// off its list, so each item wakes a thread of its own.
	hot  []*hotWaiter
	cold []chan struct{}
	// closed, once closed, ends every wait.
	closed chan struct{}

	busy       int         // threads that took an item and are not back for the next
	waking     int         // threads woken for an item that have not looked for it yet
	lastTake   time.Time   // when a thread last took an item
	stall      *time.Timer // runs checkStall
	stallArmed bool
	stallAfter time.Duration
	hotWait    time.Duration

	// read, if set, waits as ServeReading does: up to d, until stop, with what wakes the
	// thread meanwhile in wake; it returns what is left of d. Set before any take.
	read func(d time.Duration, stop func() bool, wake *atomic.Pointer[func()]) time.Duration
}

// stallAfter is how long queued items wait for a busy thread before another is woken (Go's
// timers may fire up to a millisecond late in an idle process).
const stallAfter = 200 * time.Microsecond

func newMailbox[T any](closed chan struct{}) *mailbox[T] {
	m := &mailbox[T]{closed: closed, stallAfter: stallAfter, hotWait: hotWait}
	m.stall = time.AfterFunc(time.Hour, m.checkStall)
	m.stall.Stop()
	return m
}

// hotWaiter is a thread asleep in its futex word until put sets it, or reading for itself
// (mailbox.read) until put sets the word and runs interrupt.
type hotWaiter struct {
	woken     atomic.Uint32
	interrupt atomic.Pointer[func()] // set while the thread reads and may sleep
}

func (w *hotWaiter) wake() {
	w.woken.Store(1)
	if interrupt := w.interrupt.Load(); interrupt != nil {
		(*interrupt)()
		return
	}
	futex.Wake(&w.woken, 1)
}

func (w *hotWaiter) isWoken() bool { return w.woken.Load() != 0 }

// hotWait is how long a Python thread waits in a futex before it waits without a P.
const hotWait = 2 * time.Millisecond

// put queues v for a thread: one back from its last item, or one it wakes. It never blocks:
// the core bounds the calls each caller has in service, and so the requests queued here.
func (m *mailbox[T]) put(v *T) {
	m.mu.Lock()
	m.items = append(m.items, v)
	if m.busy > 0 || m.waking > 0 {
		m.watchStall(m.stallAfter)
		m.mu.Unlock()
		return
	}
	m.wakeOne()
}

// wakeOne wakes a waiting thread, if there is one, and unlocks m.mu.
func (m *mailbox[T]) wakeOne() {
	switch {
	case len(m.hot) > 0:
		// The newest waiter (its cache is warm), unless one reads: it may have read this item.
		i := len(m.hot) - 1
		for j := i; j >= 0; j-- {
			if m.hot[j].interrupt.Load() != nil {
				i = j
				break
			}
		}
		w := m.hot[i]
		m.hot = slices.Delete(m.hot, i, i+1)
		m.waking++
		m.mu.Unlock()
		w.wake()
	case len(m.cold) > 0:
		c := m.cold[len(m.cold)-1]
		m.cold = m.cold[:len(m.cold)-1]
		m.waking++
		m.mu.Unlock()
		c <- struct{}{} // buffered: never blocks
	default:
		m.mu.Unlock()
	}
}

// checkStall runs m.stallAfter after items began to wait: it wakes one more thread if none took
// an item meanwhile, and watches again while items wait and threads are idle.
func (m *mailbox[T]) checkStall() {
	m.mu.Lock()
	m.stallArmed = false
	if len(m.items) == 0 {
		m.mu.Unlock()
		return
	}
	if len(m.hot) == 0 && len(m.cold) == 0 {
		m.mu.Unlock() // every thread is busy: the first one back takes the items
		return
	}
	if idle := time.Since(m.lastTake); idle < m.stallAfter {
		m.watchStall(m.stallAfter - idle)
		m.mu.Unlock()
		return
	}
	m.watchStall(m.stallAfter)
	m.wakeOne()
}

// watchStall has checkStall run after d, unless it is due already; m.mu is held.
func (m *mailbox[T]) watchStall(d time.Duration) {
	if !m.stallArmed {
		m.stallArmed = true
		m.stall.Reset(d)
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
		m.stall.Stop()
		m.stallArmed = false
	}
	m.busy++
	m.lastTake = time.Now()
	return v
}

// blocked says a thread that took an item now waits on something else (a call it made, whose
// reply may need another thread here, as a distributed backward's nested passes do): it no
// longer counts as busy, so an item queued behind it wakes an idle thread at once instead of
// waiting out stallAfter (and a late timer). unblocked undoes it.
func (m *mailbox[T]) blocked() {
	m.mu.Lock()
	m.busy--
	if len(m.items) > 0 && m.busy == 0 && m.waking == 0 {
		m.wakeOne()
		return
	}
	m.mu.Unlock()
}

// unblocked says the thread is back at its item (see blocked).
func (m *mailbox[T]) unblocked() {
	m.mu.Lock()
	m.busy++
	m.mu.Unlock()
}

// wakeAll wakes every waiting thread (the mailbox is closing).
func (m *mailbox[T]) wakeAll() {
	m.mu.Lock()
	hot, cold := m.hot, m.cold
	m.hot, m.cold = nil, nil
	m.waking += len(hot) + len(cold)
	m.mu.Unlock()
	for _, w := range hot {
		w.wake()
	}
	for _, c := range cold {
		c <- struct{}{}
	}
}

// take returns the next item, waiting at most timeoutMs and not past closed; nil if none came.
// back says the thread is done with the item it took last: only then does it wait in its
// futex first.
func (m *mailbox[T]) take(timeoutMs int, back bool) *T {
	d := time.Duration(timeoutMs) * time.Millisecond
	start := time.Now()
	hotUntil := start
	if back {
		hotUntil = start.Add(min(d, m.hotWait))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if back {
		m.busy--
	}
	for {
		if v := m.pop(); v != nil {
			return v
		}
		left := time.Until(hotUntil)
		if left <= 0 || isClosed(m.closed) {
			break
		}
		w := &hotWaiter{}
		m.hot = append(m.hot, w)
		m.mu.Unlock()
		if m.read != nil {
			left = m.read(left, w.isWoken, &w.interrupt)
		}
		if left > 0 {
			futex.Sleep(&w.woken, 0, left)
		}
		m.mu.Lock()
		if i := slices.Index(m.hot, w); i >= 0 { // timed out: no put chose it
			m.hot = slices.Delete(m.hot, i, i+1)
		} else {
			m.waking--
		}
	}
	rest := d - time.Since(start)
	if rest <= 0 || isClosed(m.closed) {
		return nil
	}
	woken := make(chan struct{}, 1)
	m.cold = append(m.cold, woken)
	m.mu.Unlock()
	t := time.NewTimer(rest)
	select {
	case <-woken:
	case <-m.closed:
	case <-t.C:
	}
	t.Stop()
	m.mu.Lock()
	if i := slices.Index(m.cold, woken); i >= 0 {
		m.cold = slices.Delete(m.cold, i, i+1)
	} else {
		m.waking--
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

package pybind

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waiting reports how many threads wait on m in their futex (hot) and on channels (cold), and
// whether none is busy with an item or woken for one and no item waits.
func (m *mailbox[T]) waiting() (hot, cold int, settled bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.hot), len(m.cold), m.busy == 0 && m.waking == 0 && len(m.items) == 0
}

// waitUntil waits up to 10 s for cond, checking it often (a futex wait lasts hotWait), and
// fails the test naming what if it does not hold.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
	}
}

func TestMailboxDeliversEveryItemOnce(t *testing.T) {
	cases := []struct {
		name string
		// pause before each put: none (takers hot), or past hotWait (takers cold)
		pause time.Duration
	}{
		{"takers in the futex", 0},
		{"takers on the channel", 3 * hotWait},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMailbox[int](make(chan struct{}))
			const takers, items = 4, 40
			got := make(chan int, items)
			var wg sync.WaitGroup
			for range takers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for back := false; ; back = true {
						v := m.take(2000, back)
						if v == nil || *v < 0 {
							return
						}
						got <- *v
					}
				}()
			}
			for i := range items {
				if c.pause > 0 && i%10 == 0 {
					time.Sleep(c.pause)
				}
				m.put(&i)
			}
			seen := map[int]bool{}
			for range items {
				select {
				case v := <-got:
					if seen[v] {
						t.Fatalf("item %d delivered twice", v)
					}
					seen[v] = true
				case <-time.After(5 * time.Second):
					t.Fatalf("only %d of %d items delivered", len(seen), items)
				}
			}
			stop := -1
			for range takers {
				m.put(&stop)
			}
			wg.Wait()
		})
	}
}

func TestMailboxWaitsEnd(t *testing.T) {
	closed := make(chan struct{})
	m := newMailbox[int](closed)
	start := time.Now()
	if v := m.take(20, false); v != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("an empty take returned %v after %s, want nil after 20ms", v, time.Since(start))
	}
	done := make(chan *int)
	go func() { done <- m.take(60_000, false) }()
	time.Sleep(3 * hotWait) // the taker is on the channel by now, or still in the futex: either must end
	close(closed)
	m.wakeAll()
	select {
	case v := <-done:
		if v != nil {
			t.Fatalf("take after close returned %v", *v)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a waiting take did not end when the mailbox closed")
	}
}

// TestMailboxBurstWakesAThreadPerItem: a burst of items while one thread is in its futex and
// the rest on channels wakes a thread for every item, at once or when the busy ones do not
// come back, so handlers that each hold their item until all are taken (a call waiting on the
// others) all get one.
func TestMailboxBurstWakesAThreadPerItem(t *testing.T) {
	m := newMailbox[int](make(chan struct{}))
	const takers, burst = 8, 7
	var got sync.WaitGroup
	got.Add(burst)
	allGot := make(chan struct{})
	go func() { got.Wait(); close(allGot) }()
	for range takers {
		go func() {
			for back := false; ; back = true {
				v := m.take(5000, back)
				if v == nil || *v < 0 {
					return
				}
				if *v == 0 {
					continue // the warm-up item: straight back, into the futex
				}
				got.Done()
				<-allGot // hold the item, as a handler waiting on the others would
				return
			}
		}()
	}
	waitUntil(t, "every thread waits on its channel", func() bool {
		hot, cold, settled := m.waiting()
		return hot == 0 && cold == takers && settled
	})
	// One thread takes the warm-up item and goes back to wait in its futex, while the others
	// stay on their channels. Its futex wait is short (hotWait): if it went by unseen, warm up
	// again.
	warmUp := 0
	waitUntil(t, "one thread waits in its futex, the others on their channels", func() bool {
		switch hot, cold, settled := m.waiting(); {
		case hot == 1 && cold == takers-1 && settled:
			return true
		case hot == 0 && cold == takers && settled: // not warmed up yet, or cold again
			m.put(&warmUp)
		}
		return false
	})
	for i := 1; i <= burst; i++ {
		m.put(&i)
	}
	select {
	case <-allGot:
	case <-time.After(time.Second):
		t.Fatal("a burst of items did not wake a thread for each within 1 s")
	}
	stop := -1
	for range takers {
		m.put(&stop)
	}
}

// TestMailboxItemWaitsForTheBusyThread: an item put while a thread is busy with the last one
// goes to that thread when it comes back, not to another woken for it; and a busy thread that
// does not come back has the item given to another.
func TestMailboxItemWaitsForTheBusyThread(t *testing.T) {
	cases := []struct {
		name      string
		stall     time.Duration
		comesBack bool
		want      string
	}{
		{"busy thread comes back", time.Hour, true, "busy"},
		{"busy thread stays blocked", time.Millisecond, false, "other"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			closed := make(chan struct{})
			m := newMailbox[int](closed)
			m.stallAfter = c.stall
			got := make(chan string, 2)
			first, second := 1, 2
			release := make(chan struct{})
			took := make(chan struct{})
			go func() { // the busy thread
				if v := m.take(5000, false); v == nil || *v != first {
					t.Errorf("the busy thread took %v, want item 1", v)
				}
				close(took)
				<-release
				if !c.comesBack {
					return
				}
				if v := m.take(5000, true); v != nil {
					got <- "busy"
				}
			}()
			m.put(&first)
			<-took
			go func() { // another thread; it waits longer than the test, so only a wake-up brings it item 2
				if v := m.take(60_000, false); v != nil {
					got <- "other"
				}
			}()
			// The other waits on its channel, past its futex wait (in which it would look for
			// items again when the wait ends, woken or not); the busy thread holds item 1.
			waitUntil(t, "the other thread waits on its channel", func() bool {
				hot, cold, _ := m.waiting()
				return hot == 0 && cold == 1
			})
			m.put(&second)
			if c.comesBack {
				close(release)
			}
			select {
			case who := <-got:
				if who != c.want {
					t.Fatalf("item 2 went to the %s thread, want the %s one", who, c.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("item 2 was not taken")
			}
			if !c.comesBack {
				close(release)
			}
			close(closed) // ends the thread still waiting
			m.wakeAll()
		})
	}
}

// fakeReader is a stream that threads waiting on a mailbox read for themselves (mailbox.read),
// one at a time, as core.Agent.ServeReading does: an item it reads it puts in the mailbox, as
// the request's handler does.
type fakeReader struct {
	m          *mailbox[int]
	incoming   chan int
	reading    atomic.Bool
	interrupts atomic.Int32
	// misdirected counts items a reading thread put that went to another thread.
	misdirected atomic.Int32
}

func (r *fakeReader) read(d time.Duration, stop func() bool, wake *atomic.Pointer[func()]) time.Duration {
	deadline := time.Now().Add(d)
	if !r.reading.CompareAndSwap(false, true) {
		return d // another thread reads
	}
	defer r.reading.Store(false)
	interrupted := make(chan struct{}, 1)
	interrupt := func() {
		r.interrupts.Add(1)
		select {
		case interrupted <- struct{}{}:
		default:
		}
	}
	wake.Store(&interrupt)
	defer wake.Store(nil)
	for !stop() {
		left := time.Until(deadline)
		if left <= 0 {
			return 0
		}
		select {
		case v := <-r.incoming:
			r.m.put(&v)
			if !stop() {
				r.misdirected.Add(1)
			}
		case <-interrupted:
		case <-time.After(left):
		}
	}
	return time.Until(deadline)
}

// TestMailboxItemGoesToTheThreadThatReadIt: an item a waiting thread read itself (its request,
// read from the caller's stream) is that thread's to take, not another's in its futex beside
// it; and an item put meanwhile from elsewhere wakes a reading thread through its interrupt.
func TestMailboxItemGoesToTheThreadThatReadIt(t *testing.T) {
	m := newMailbox[int](make(chan struct{}))
	m.hotWait = time.Hour // threads back from an item wait in their futex, reading, until the test ends
	const takers, items = 4, 300
	r := &fakeReader{m: m, incoming: make(chan int, items)}
	m.read = r.read
	warmUp := items
	got := make(chan int, 100_000)
	var wg sync.WaitGroup
	for range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for back := false; ; {
				v := m.take(5000, back)
				if v == nil {
					back = false
					continue
				}
				if *v < 0 {
					return
				}
				if *v == warmUp {
					// Held a while, as a handler would: the other warm-ups wake other threads.
					time.Sleep(time.Millisecond)
				}
				got <- *v
				back = true
			}
		}()
	}
	// Threads back from an item wait in their futex, one of them reading: warm-up items put
	// from outside get them back. Then no thread is on its way to an item (one woken for a
	// warm-up another took would be given the next item put), and the items the reading
	// thread reads follow.
	waitUntil(t, "threads wait in their futex, one reading, none woken", func() bool {
		hot, _, settled := m.waiting()
		if hot >= 2 && settled && r.reading.Load() {
			return true
		}
		if hot == 0 && settled {
			for range takers {
				m.put(&warmUp)
			}
		}
		return false
	})
	for i := range items {
		r.incoming <- i
	}
	seen := map[int]bool{}
	for len(seen) < items {
		select {
		case v := <-got:
			if v != warmUp {
				seen[v] = true
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of %d items taken (%d were read)", len(seen), items, items-len(r.incoming))
		}
	}
	if n := r.misdirected.Load(); n > 0 {
		t.Fatalf("%d of %d items a thread read went to another thread", n, items)
	}
	// An item from elsewhere, while a thread reads: it is woken through its interrupt.
	waitUntil(t, "a thread reads", r.reading.Load)
	before := r.interrupts.Load()
	outside := items + 1
	m.put(&outside)
	for taken := false; !taken; {
		select {
		case v := <-got:
			taken = v == outside
		case <-time.After(5 * time.Second):
			t.Fatal("the item put from outside was not taken")
		}
	}
	if r.interrupts.Load() == before {
		t.Fatal("the item put from outside did not interrupt the reading thread")
	}
	stop := -1
	for range takers {
		m.put(&stop)
	}
	wg.Wait()
}

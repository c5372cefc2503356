package core_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
)

// servingThreads has n goroutines, each locked to its thread as a Python pool thread is, wait
// for requests by reading (ServeReading) in slices of slice until the returned stop runs.
func servingThreads(a *core.Agent, n int, slice time.Duration) (stop func()) {
	var stopped atomic.Bool
	var wg sync.WaitGroup
	wakes := make([]atomic.Pointer[func()], n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for !stopped.Load() {
				if left := a.ServeReading(slice, stopped.Load, &wakes[i]); left > 0 {
					time.Sleep(min(left, time.Millisecond)) // it could not read: wait otherwise
				}
			}
		}()
	}
	return func() {
		stopped.Store(true)
		for i := range wakes {
			if wake := wakes[i].Load(); wake != nil {
				(*wake)()
			}
		}
		wg.Wait()
	}
}

// TestIdleThreadsServeWhatTheyRead: over shared memory, idle threads on the callee read the
// caller's stream themselves and serve the requests there, beside the reader goroutine, small
// and big requests mixed; each request is served once, the small ones in the order the caller
// sent them (a big one streams through in parts, which small ones may overtake on any
// transport).
func TestIdleThreadsServeWhatTheyRead(t *testing.T) {
	forEachSelfReadingTransport(t, testIdleThreadsServeWhatTheyRead)
}

func testIdleThreadsServeWhatTheyRead(t *testing.T, transportName string) {
	var mu sync.Mutex
	last := int64(-1)
	served := map[int64]int{}
	inOrder := inlineHandler(func(call *core.ServerCall) {
		seq := int64(binary.LittleEndian.Uint64(call.Request.Payload))
		mu.Lock()
		if len(call.Request.Payload) == 8 {
			if seq <= last {
				t.Errorf("small request %d served after %d", seq, last)
			}
			last = seq
		}
		served[seq]++
		mu.Unlock()
		call.Reply(core.Message{Payload: bytes.Clone(call.Request.Payload)})
		call.Request.Release()
	})
	c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{transportName}, Handlers: map[string]core.Handler{"in order": inOrder}})
	stop := servingThreads(c.Agents[1], 3, 20*time.Millisecond)
	defer stop()

	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB: the bulk lane, read by Recv
	const rounds, inFlight = 60, 8
	seq := int64(0)
	for r := range rounds {
		// A few calls in flight at once, then one at a time with pauses in which the
		// callee's readers go to sleep: requests then wake a thread, not the goroutine.
		n := inFlight
		if r%2 == 1 {
			n = 1
			time.Sleep(time.Millisecond)
		}
		futures := make([]*core.CallFuture, n)
		wants := make([][]byte, n)
		for i := range n {
			want := binary.LittleEndian.AppendUint64(nil, uint64(seq))
			seq++
			if r%20 == 0 && i == 0 {
				want = append(want, big...)
			}
			wants[i] = want
			futures[i] = c.Agents[0].CallAsync(testctx.For(t), "w1", "in order", core.Message{Payload: want})
		}
		for i, f := range futures {
			resp, err := f.Result()
			if err != nil || !bytes.Equal(resp.Payload, wants[i]) {
				t.Fatalf("round %d call %d: %d bytes, %v", r, i, len(resp.Payload), err)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for s := range seq {
		if served[s] != 1 {
			t.Fatalf("request %d served %d times", s, served[s])
		}
	}
	if read := c.Agents[1].SelfReadFrames(); read == 0 {
		t.Fatal("no idle thread read a request itself")
	} else {
		t.Logf("idle threads read %d of %d requests themselves", read, seq)
	}
}

// TestAReadingThreadGivesBackItsSlot: a thread reading for requests holds one of the caller's
// slots (calls in service at once) while it waits; when the caller's requests need every slot,
// the thread gives its slot back rather than hold the stream up, and every call is served. The
// requests are big: the reader goroutine reads them while the thread sleeps.
func TestAReadingThreadGivesBackItsSlot(t *testing.T) {
	forEachSelfReadingTransport(t, testAReadingThreadGivesBackItsSlot)
}

func testAReadingThreadGivesBackItsSlot(t *testing.T, transportName string) {
	const slots = 3
	var mu sync.Mutex
	var parked []*core.ServerCall
	park := inlineHandler(func(call *core.ServerCall) { // replies later, from the test
		mu.Lock()
		parked = append(parked, call)
		mu.Unlock()
	})
	c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{transportName}, Handlers: map[string]core.Handler{"park": park}, MaxServedPerCaller: slots})
	stop := servingThreads(c.Agents[1], 1, 10*time.Second) // long slices: only a wake-up ends one early
	defer stop()

	// A first call makes the stream the one the thread reads.
	first := c.Agents[0].CallAsync(testctx.For(t), "w1", "park", core.Message{Payload: []byte("first")})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		if len(parked) == 1 {
			parked[0].Reply(core.Message{})
			parked = nil
			mu.Unlock()
			break
		}
		mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the first call never reached the handler")
		}
	}
	if _, err := first.Result(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the thread is most likely asleep at the doorbell by now

	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB: the bulk lane, read by Recv
	futures := make([]*core.CallFuture, 2*slots)
	for i := range futures {
		futures[i] = c.Agents[0].CallAsync(testctx.For(t), "w1", "park", core.Message{Payload: append([]byte(fmt.Sprint(i)), big...)})
	}
	// Every slot's call must reach the handler: none is kept by the reading thread.
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(parked)
		mu.Unlock()
		if n == slots {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls reached the handler, want %d (a slot stayed with the reading thread)", n, slots)
		}
		time.Sleep(time.Millisecond)
	}
	// Replies free slots; the rest of the calls come in as they do.
	for answered := 0; answered < len(futures); {
		mu.Lock()
		batch := parked
		parked = nil
		mu.Unlock()
		for _, call := range batch {
			call.Reply(core.Message{Payload: call.Request.Payload})
		}
		answered += len(batch)
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("only %d of %d calls were served", answered, len(futures))
		}
		time.Sleep(time.Millisecond)
	}
	for i, f := range futures {
		if resp, err := f.Result(); err != nil || !bytes.Equal(resp.Payload, append([]byte(fmt.Sprint(i)), big...)) {
			t.Fatalf("call %d: %d bytes, %v", i, len(resp.Payload), err)
		}
	}
}

// TestServeReadingEnds: a thread reading for requests returns when woken (what wake holds ran
// and stop reports true), at its deadline, and at once where it cannot read.
func TestServeReadingEnds(t *testing.T) {
	forEachSelfReadingTransport(t, testServeReadingEnds)
}

func testServeReadingEnds(t *testing.T, transportName string) {
	c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{transportName}, Handlers: testHandlers(nil)})
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var wake atomic.Pointer[func()]
	never := func() bool { return false }

	// No caller served yet: nothing to read, the whole wait is left.
	if left := c.Agents[1].ServeReading(time.Second, never, &wake); left < 900*time.Millisecond {
		t.Fatalf("with no stream to read, %v of 1s was left", left)
	}
	if _, err := c.Agents[0].Call(testctx.For(t), "w1", "echo", core.Message{Payload: []byte("hi")}); err != nil {
		t.Fatal(err)
	}

	// It reads until its deadline (a try may find the reader goroutine just back from the
	// call: it cannot read then).
	waited := false
	for try := 0; try < 100 && !waited; try++ {
		start := time.Now()
		left := c.Agents[1].ServeReading(100*time.Millisecond, never, &wake)
		took := time.Since(start)
		if waited = took >= 90*time.Millisecond; waited && left != 0 {
			t.Fatalf("returned after %v with %v left", took, left)
		}
		if !waited && left < 90*time.Millisecond {
			t.Fatalf("returned after %v with %v left, before its deadline", took, left)
		}
		time.Sleep(time.Millisecond)
	}
	if !waited {
		t.Fatal("the thread never read the stream of the caller served last")
	}

	var woken atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond)
		woken.Store(true)
		if w := wake.Load(); w != nil {
			(*w)()
		}
	}()
	start := time.Now()
	for time.Since(start) < 5*time.Second && !woken.Load() {
		c.Agents[1].ServeReading(10*time.Second, woken.Load, &wake)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a woken thread returned after %v", took)
	}
	if wake.Load() != nil {
		t.Fatal("ServeReading left its wake-up behind")
	}
}

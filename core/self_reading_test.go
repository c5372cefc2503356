package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
)

// awaitByReading waits for f as a Python thread does: reading the stream itself
// (AwaitReading) while it can, else on the future. It reports whether the reply reached it
// while it read.
func awaitByReading(t *testing.T, f *core.CallFuture) (readIt bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for first := true; time.Now().Before(deadline); first = false {
		left := f.AwaitReading(100 * time.Millisecond)
		select {
		case <-f.Done():
			return first && left > 0
		default:
		}
		select {
		case <-f.Done():
			return false
		case <-time.After(left):
		}
	}
	t.Fatal("a call waited for by reading never completed")
	return false
}

// TestThreadsWaitingForRepliesReadThemThemselves: over shared memory, threads waiting for
// their calls read the stream themselves, beside the reader goroutine, small and big replies
// mixed; every call gets its own reply.
func TestThreadsWaitingForRepliesReadThemThemselves(t *testing.T) {
	forEachSelfReadingTransport(t, testThreadsWaitingForRepliesReadThemThemselves)
}

func testThreadsWaitingForRepliesReadThemThemselves(t *testing.T, transportName string) {
	c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{transportName}, Handlers: testHandlers(nil)})
	const threads, calls = 8, 150
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB: the bulk lane, in chunks
	var wg sync.WaitGroup
	var mu sync.Mutex
	readThemselves := 0
	for th := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for i := range calls {
				want := []byte(fmt.Sprintf("%d/%d", th, i))
				if i%50 == th {
					want = append(want, big...)
				}
				f := c.Agents[0].CallAsync(testctx.For(t), "w1", "echo", core.Message{Payload: want})
				read := awaitByReading(t, f)
				resp, err := f.Result()
				if err != nil || !bytes.Equal(resp.Payload, want) {
					t.Errorf("call %d/%d: %d bytes, %v", th, i, len(resp.Payload), err)
					return
				}
				if read {
					mu.Lock()
					readThemselves++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	// One thread at a time reads; the others wait for it or the goroutine.
	read := c.Agents[0].SelfReadFrames()
	if read == 0 {
		t.Fatal("no waiting thread read a reply itself")
	}
	t.Logf("waiting threads read %d frames themselves; %d of %d calls were done within their first wait", read, readThemselves, threads*calls)
}

// TestAThreadReadingForItselfHearsOfTheEnd: a thread asleep reading for its reply wakes, with
// the call failed, when the call's deadline passes or the callee goes away.
func TestAThreadReadingForItselfHearsOfTheEnd(t *testing.T) {
	forEachSelfReadingTransport(t, testAThreadReadingForItselfHearsOfTheEnd)
}

func testAThreadReadingForItselfHearsOfTheEnd(t *testing.T, transportName string) {
	for _, c := range []struct {
		name    string
		timeout time.Duration
		end     func(c *coretest.Cluster)
		want    error
	}{
		{"deadline", 200 * time.Millisecond, func(*coretest.Cluster) {}, core.ErrTimeout},
		{"callee gone", 0, func(c *coretest.Cluster) { c.Agents[1].Shutdown(context.Background(), false) }, core.ErrPeerLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			handlers := testHandlers(release)
			// Unlike "block", it does not answer when its caller's deadline passes: nothing
			// from the callee wakes the waiting thread.
			handlers["hold"] = core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) {
				<-release
				return core.Message{}, nil
			})
			cl := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{transportName}, Handlers: handlers})
			ctx := testctx.For(t)
			if c.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.timeout)
				defer cancel()
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			f := cl.Agents[0].CallAsync(ctx, "w1", "hold", core.Message{})
			go func() {
				time.Sleep(100 * time.Millisecond)
				c.end(cl)
			}()
			// Each AwaitReading may sleep its whole 10 s unless the call's end wakes it; one
			// that cannot read (the reader goroutine reads just then) returns at once.
			start := time.Now()
			for done := false; !done && time.Since(start) < 5*time.Second; {
				if left := f.AwaitReading(10 * time.Second); left > 9*time.Second {
					time.Sleep(time.Millisecond)
				}
				select {
				case <-f.Done():
					done = true
				default:
				}
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("the reading thread heard of the end after %v", took)
			}
			if _, err := f.Result(); !errors.Is(err, c.want) || !strings.Contains(err.Error(), `"w1"`) {
				t.Fatalf("err = %v, want %v naming w1", err, c.want)
			}
		})
	}
}

// TestARepliesMemoryGoesBackToThePoolWhoeverReadIt: a reply a waiting thread read itself lives
// in pooled memory, as one the reader goroutine read does; releasing it gives that memory
// back for the next message to use.
func TestARepliesMemoryGoesBackToThePoolWhoeverReadIt(t *testing.T) {
	forEachSelfReadingTransport(t, testARepliesMemoryGoesBackToThePoolWhoeverReadIt)
}

func testARepliesMemoryGoesBackToThePoolWhoeverReadIt(t *testing.T, transportName string) {
	c := coretest.New(t, 2, coretest.Options{GRPC: true, Transports: []string{transportName}, Handlers: testHandlers(nil)})
	payload := bytes.Repeat([]byte("p"), 200<<10) // one frame, decoded into pooled memory
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	readByThread, returned := 0, 0
	for range 40 {
		f := c.Agents[0].CallAsync(testctx.For(t), "w1", "echo", core.Message{Payload: payload})
		read := awaitByReading(t, f)
		resp, err := f.Result()
		if err != nil || !bytes.Equal(resp.Payload, payload) {
			t.Fatalf("%d bytes, %v", len(resp.Payload), err)
		}
		if !read {
			continue
		}
		readByThread++
		idle := bufpool.Shared.Idle()
		resp.Release()
		if bufpool.Shared.Idle() > idle {
			returned++
		}
	}
	if readByThread == 0 {
		t.Fatal("no reply was read by the waiting thread")
	}
	if returned < readByThread/2 {
		t.Fatalf("of %d replies the waiting thread read, %d gave their memory back to the pool when released", readByThread, returned)
	}
}

// forEachSelfReadingTransport runs test once over each transport whose streams threads read
// for themselves (transport.SelfReading).
func forEachSelfReadingTransport(t *testing.T, test func(t *testing.T, transportName string)) {
	for _, name := range []string{core.TransportSHM, core.TransportTCP} {
		t.Run(name, func(t *testing.T) { test(t, name) })
	}
}

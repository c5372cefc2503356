package pybind

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// TestInterruptsEndInterruptibleWaits drives the process's one signal pipe through its life:
// a byte ends an interruptible wait and not another; a signal that came while no wait ran
// ends the next interruptible wait once; a pipe whose writer closed is no longer watched, so
// Python goes back to short slices.
func TestInterruptsEndInterruptibleWaits(t *testing.T) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	writeEnd := os.NewFile(uintptr(fds[1]), "test-signal-pipe")
	if !WatchInterrupts(fds[0]) || !WatchingInterrupts() {
		t.Fatal("the pipe is not watched")
	}
	if WatchInterrupts(fds[0]) {
		t.Fatal("a second pipe was accepted")
	}
	never := make(chan struct{})
	waitFor := func(interruptible bool, d time.Duration) (bool, time.Duration) {
		start := time.Now()
		timer := time.NewTimer(d)
		defer timer.Stop()
		interrupted := !awaitClose(never, timer.C, interruptible)
		return interrupted && time.Since(start) < d/2, time.Since(start)
	}
	// A signal during an interruptible wait ends it at once.
	go func() {
		time.Sleep(20 * time.Millisecond) // the wait has begun by then; if not, the pending rule below still ends it
		writeEnd.Write([]byte{2})
	}()
	if early, took := waitFor(true, 10*time.Second); !early {
		t.Fatalf("an interruptible wait ran %v past the signal", took)
	}
	// A signal that came between waits ends the next interruptible one, once; an
	// uninterruptible wait does not see it.
	writeEnd.Write([]byte{2})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		interrupts.mu.Lock()
		pending := interrupts.pending
		interrupts.mu.Unlock()
		if pending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the byte written to the pipe was never read")
		}
	}
	if early, _ := waitFor(false, 50*time.Millisecond); early {
		t.Fatal("an uninterruptible wait ended for a signal")
	}
	if early, took := waitFor(true, 10*time.Second); !early {
		t.Fatalf("a signal that came between waits did not end the next interruptible one (it ran %v)", took)
	}
	if early, _ := waitFor(true, 50*time.Millisecond); early {
		t.Fatal("one signal ended two waits")
	}
	// The writer gone, the pipe is no longer watched.
	writeEnd.Close()
	for deadline := time.Now().Add(10 * time.Second); WatchingInterrupts(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a pipe whose writer closed is still taken as watched")
		}
	}
}

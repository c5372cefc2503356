package pybind

import (
	"os"
	"sync"
	"time"
)

// Python runs a signal's handler (Ctrl-C's KeyboardInterrupt) on its main thread, and only once
// that thread is back from Go. A main thread waiting in Go used to come back every 100 ms to let
// a handler run: at rest, those wake-ups were most of an idle worker's CPU (a timer, a netpoll
// break, a thread hand-off each). Instead Python points its signal wakeup fd
// (signal.set_wakeup_fd) at a pipe this package reads: its C-level handler writes a byte there
// as a signal arrives, and the main thread's wait returns at once.

// interrupts is the process's signal wake-ups, as read from Python's wakeup fd.
var interrupts struct {
	mu       sync.Mutex
	pending  bool          // a signal came that no wait has returned for yet
	next     chan struct{} // closed when the next signal comes
	watching bool
}

// WatchInterrupts reads fd, the read end of the pipe that is Python's signal wakeup fd (made
// non-blocking by Python), for the rest of the process: each byte wakes the waits that asked
// to be interruptible. It reports false if a pipe is already watched.
func WatchInterrupts(fd int) bool {
	interrupts.mu.Lock()
	defer interrupts.mu.Unlock()
	if interrupts.watching {
		return false
	}
	interrupts.watching = true
	interrupts.next = make(chan struct{})
	// A non-blocking descriptor goes to Go's netpoller: the read waits without a thread.
	pipe := os.NewFile(uintptr(fd), "python-signal-wakeup")
	go func() {
		var buf [64]byte
		for {
			n, err := pipe.Read(buf[:])
			if n > 0 {
				interrupted()
			}
			if err != nil {
				interrupts.mu.Lock()
				interrupts.watching = false // Python then waits in short slices again
				interrupts.mu.Unlock()
				return
			}
		}
	}()
	return true
}

// WatchingInterrupts reports whether a pipe is watched (WatchInterrupts), its reader alive.
func WatchingInterrupts() bool {
	interrupts.mu.Lock()
	defer interrupts.mu.Unlock()
	return interrupts.watching
}

// interrupted wakes every interruptible wait.
func interrupted() {
	interrupts.mu.Lock()
	defer interrupts.mu.Unlock()
	interrupts.pending = true
	close(interrupts.next)
	interrupts.next = make(chan struct{})
}

// interruption returns what an interruptible wait also selects on: a channel closed by the
// next signal, or a closed one if a signal came since the last wait returned for one (it is
// then taken). Without interruptible, or with no pipe watched, nil: it never fires.
func interruption(interruptible bool) <-chan struct{} {
	if !interruptible {
		return nil
	}
	interrupts.mu.Lock()
	defer interrupts.mu.Unlock()
	if interrupts.pending {
		interrupts.pending = false
		return closedChan
	}
	return interrupts.next
}

// closedChan is a channel that is always closed.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// awaitClose waits for done to close, until timeout fires or, if interruptible, a signal
// comes (which it then takes); it reports whether done closed.
func awaitClose(done <-chan struct{}, timeout <-chan time.Time, interruptible bool) bool {
	select {
	case <-done:
		return true
	case <-timeout:
		return false
	case <-interruption(interruptible):
		interrupts.mu.Lock()
		interrupts.pending = false
		interrupts.mu.Unlock()
		return false
	}
}

// Package futex sleeps and wakes on 32-bit words, in this process or in memory shared with
// others. A goroutine that sleeps here holds its thread in the kernel; the waker's futex call
// wakes that thread directly, without Go's scheduler handing it a P.
package futex

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The words may be shared between processes: no FUTEX_PRIVATE_FLAG.
const (
	opWait = 0
	opWake = 1
)

// Sleep sleeps while *word == seen, at most d; it may return early for no reason.
func Sleep(word *atomic.Uint32, seen uint32, d time.Duration) {
	ts := unix.NsecToTimespec(max(d, 0).Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), opWait, uintptr(seen), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// Wake wakes up to n sleepers on word.
func Wake(word *atomic.Uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), opWake, uintptr(n), 0, 0, 0)
}

// WakeAll wakes every sleeper on word.
func WakeAll(word *atomic.Uint32) { Wake(word, 1<<31-1) }

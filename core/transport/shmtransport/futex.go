package shmtransport

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futexes here are shared between processes (no FUTEX_PRIVATE_FLAG): the words live in a
// region both map.
const (
	futexWait = 0
	futexWake = 1
)

// futexSleep sleeps while *word == seen, at most d; it may return early for no reason.
func futexSleep(word *atomic.Uint32, seen uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWait, uintptr(seen), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWakeAll wakes every sleeper on word.
func futexWakeAll(word *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWake, uintptr(1<<31-1), 0, 0, 0)
}

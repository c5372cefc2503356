package pybind

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// freshMemoryBytes is the size from which Go readies the Python memory it copies a segment
	// into. A big bytes object or bytearray is a fresh mapping (glibc maps anything over 32 MiB
	// anew each time), and on these VMs first-touching it costs a fault per 4 KiB page: a
	// 128 MiB bytes object filled that way came at 0.33 GB/s, and 7 GB/s readied. Below this,
	// the memory is mostly reused heap, already in place.
	freshMemoryBytes = 8 << 20
	hugePageBytes    = 2 << 20
)

// readyFresh asks the kernel to back mem with huge pages where the system allows it (THP in
// "madvise" mode) and to populate it in one system call, before it is written. Both are
// hints: a kernel without them (MADV_POPULATE_WRITE is Linux 5.14) leaves the first writes to
// fault the pages in as before. Only whole pages inside mem are advised, so memory that
// shares a page with it is never touched.
func readyFresh(mem []byte) {
	if len(mem) < freshMemoryBytes {
		return
	}
	if huge := within(mem, hugePageBytes); len(huge) > 0 {
		_ = unix.Madvise(huge, unix.MADV_HUGEPAGE)
	}
	if pages := within(mem, unix.Getpagesize()); len(pages) > 0 {
		_ = unix.Madvise(pages, unix.MADV_POPULATE_WRITE)
	}
}

// within is the part of mem made of whole aligned blocks of size bytes (a power of two).
func within(mem []byte, size int) []byte {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	end := start + uintptr(len(mem))
	first := (start + uintptr(size) - 1) &^ (uintptr(size) - 1)
	last := end &^ (uintptr(size) - 1)
	if last <= first {
		return nil
	}
	return mem[first-start : last-start]
}

// Package pybind is the only cgo boundary of tensorplay-rpc: the Go agent as gopy wraps it
// into the CPython extension tensorplay_rpc._native.
//
// Only ints, floats, bools, strings and pointers to opaque structs cross it (see DESIGN.md).
// Byte buffers cross as (address, length) pairs: Python passes a table of uint64 pairs naming
// its buffers. Go copies a small message before returning and sends a big one (BorrowThreshold
// and more) from Python's memory in place, which Python keeps until the call is done. A big
// message coming in is lent to Python in the pooled buffer it arrived in (Segments.Lend);
// a small one Python copies into objects it allocates. Go never calls into Python: Python
// threads pull requests and events with calls that block for at most a given number of
// milliseconds (agent.go, request.go, events.go, call.go), so Ctrl-C still reaches Python.
package pybind

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// PyMethod is the method every Python-level message is sent to; Python reads its kind from
// the payload.
const PyMethod = "py"

// BorrowThreshold is the message size from which Go sends Python's memory in place instead of
// copying it, and lends received messages' memory to Python.
const BorrowThreshold = core.DefaultChunkSize

// Call statuses, the stable error kinds Python maps to exception types.
const (
	StatusOK = iota
	StatusRemoteError
	StatusTimeout
	StatusPeerLost
	StatusUnknownWorker
	StatusShutdown
	StatusNoHandler
	StatusCanceled
	StatusOther
)

func statusOf(err error) int {
	var re *core.RemoteError
	switch {
	case err == nil:
		return StatusOK
	case errors.As(err, &re):
		return StatusRemoteError
	case errors.Is(err, core.ErrTimeout):
		return StatusTimeout
	case errors.Is(err, core.ErrPeerLost):
		return StatusPeerLost
	case errors.Is(err, core.ErrUnknownWorker):
		return StatusUnknownWorker
	case errors.Is(err, core.ErrShutdown):
		return StatusShutdown
	case errors.Is(err, core.ErrNoHandler):
		return StatusNoHandler
	case errors.Is(err, core.ErrCanceled):
		return StatusCanceled
	default:
		return StatusOther
	}
}

// recovered turns a panic into an error: a Go panic would abort the whole Python process.
func recovered(err *error) {
	if r := recover(); r != nil {
		e := fmt.Errorf("tensorplay-rpc internal error: %v\n%s", r, debug.Stack())
		slog.Error(e.Error())
		if err != nil {
			*err = e
		}
	}
}

// pythonMemory turns the address of memory Python owns into a pointer. The memory is not Go's,
// so the garbage collector neither moves nor frees it; Python keeps it alive during the call.
func pythonMemory(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}

// segments reads a table of n (address, length) uint64 pairs naming Python buffers. With
// borrow the message refers to Python's memory, which Python must keep alive and unchanged
// until the message is sent; otherwise the buffers are copied.
func segments(table uintptr, n int, borrow bool) core.Message {
	if n <= 0 {
		return core.Message{}
	}
	pairs := unsafe.Slice((*uint64)(pythonMemory(table)), 2*n)
	read := func(i int) []byte {
		addr, size := uintptr(pairs[2*i]), int(pairs[2*i+1])
		if size == 0 {
			return []byte{}
		}
		b := unsafe.Slice((*byte)(pythonMemory(addr)), size)
		if borrow {
			return b
		}
		return append([]byte(nil), b...)
	}
	m := core.Message{Payload: read(0)}
	for i := 1; i < n; i++ {
		m.Buffers = append(m.Buffers, read(i))
	}
	return m
}

// tableSize is the number of bytes the table names.
func tableSize(table uintptr, n int) int {
	if n <= 0 {
		return 0
	}
	total := 0
	for i, v := range unsafe.Slice((*uint64)(pythonMemory(table)), 2*n) {
		if i%2 == 1 {
			total += int(v)
		}
	}
	return total
}

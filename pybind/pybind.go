// Package pybind is the only cgo boundary of tensorplay-rpc: the Go agent as gopy wraps it
// into the CPython extension tensorplay_rpc._native. One Python module, tensorplay_rpc._agent,
// calls it; everything it exports is used there. One file per concept: the agent and its
// start and shutdown (agent.go), outgoing calls (call.go), incoming requests (request.go),
// received messages (segments.go), events (events.go), RRef bookkeeping (rref.go).
//
// What gopy can carry safely shapes the whole API:
//   - Only int, int64, float64, bool, string, pointers to structs with methods, and (T, error)
//     results cross. Slices and []byte become handles copied element by element, maps,
//     channels and funcs do not work, and a Go error arrives as RuntimeError(message), so
//     Python maps errors by a stable kind (the Status constants), never by their text.
//   - A Go panic would abort the whole Python process: every exported function with an error
//     result recovers a panic into that error (recovered).
//   - Go never calls Python (gopy callbacks crash when called from goroutines): Python threads
//     pull requests and events with calls that block for at most a given number of
//     milliseconds, and gopy releases the GIL around every call, so Ctrl-C still reaches Python
//     between two such calls.
//
// Byte buffers cross as (address, length) pairs: Python passes a table of uint64 pairs naming
// its buffers. Python alone decides whether a message is borrowed in place (it passes borrow to
// Agent.Call and Request.Reply, from the message size and BorrowThreshold): with borrow Go
// sends from Python's memory, which Python keeps alive and unchanged until the call is done
// (Call.Wait) or Reply returns; without it Go copies before returning. Go never re-derives
// the decision, so the two sides cannot disagree about who owns the memory. A big message
// coming in is lent to Python in the pooled buffer it arrived in (Segments.Lend, Agent.Return);
// a small one Python copies into objects it allocates.
package pybind

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// PyMethod is the method every pickled Python-level message is sent to; Python reads its
// kind from the payload. Other methods carry msgpack (core.Func, rpc.expose).
const PyMethod = "py"

// RemoteMethod and FetchMethod make and read RRefs of functions called by name (crosslang).
const (
	RemoteMethod = core.RemoteMethod
	FetchMethod  = core.FetchMethod
)

// BorrowThreshold is the message size from which Python has Go send its memory in place
// instead of copying it before the call returns. Such a copy is a fresh allocation, and a few
// of hundreds of KiB per call had Go's garbage collector run every few calls: it is made only
// for messages small enough that it costs less than keeping Python's buffers until the call is
// done.
const BorrowThreshold = 64 << 10

// Call statuses, the stable error kinds Python maps to exception types (each has its own).
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

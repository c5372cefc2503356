package pybind

import (
	"fmt"
	"strings"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// queueHandler hands Python-level requests to Python's executor threads.
type queueHandler struct{ a *Agent }

// ServeRPC queues the call; the core bounds each caller's calls in service, and so the queue.
func (h queueHandler) ServeRPC(call *core.ServerCall) {
	h.a.requests.put(&Request{call: call, Segments: Segments{msg: call.Request, agent: h.a}})
}

// NextRequest returns the next request for Python to run, or nil if none came within
// timeoutMs or the agent is shut down. served says the thread ran the request it took last.
func (a *Agent) NextRequest(timeoutMs int, served bool) *Request {
	return a.requests.take(timeoutMs, served)
}

// ServeBlocked says a thread serving a request waits for a call it made (see mailbox.blocked);
// ServeUnblocked says it is back. They come in pairs, from a thread NextRequest gave a request.
func (a *Agent) ServeBlocked() { a.requests.blocked() }

// ServeUnblocked: see ServeBlocked.
func (a *Agent) ServeUnblocked() { a.requests.unblocked() }

// Request is one incoming Python-level call.
type Request struct {
	Segments
	call *core.ServerCall
}

// Valid reports whether the request is real (gopy turns a nil *Request into an empty one).
func (r *Request) Valid() bool { return r != nil && r.call != nil }

// Request kinds: what Take writes first in the table, so the served thread tells a pickled
// Python-level request from a call of a function by name without asking (Method).
const (
	RequestPickled = StatusOK
	RequestByName  = StatusOK + 1
)

// Take is Segments.Take with the request's kind first in the table.
func (r *Request) Take(sizes uintptr, tableLen int, buf uintptr, bufLen int) int {
	kind := RequestPickled
	if r.call.Method != PyMethod {
		kind = RequestByName
	}
	return r.take(kind, sizes, tableLen, buf, bufLen)
}

// Method is the method called: PyMethod, or the name of a function Python exposes.
func (r *Request) Method() string { return forPython(r.call.Method) }

// Expose has Python serve calls of method name (a function rpc.expose made callable from
// other languages), queued with the Python-level ones.
func (a *Agent) Expose(name string) error {
	if err := checkExposedName(name); err != nil {
		return err
	}
	a.agent.Register(name, queueHandler{a})
	return nil
}

// ExposeImports has Python serve (or, with allow false, stop serving) calls of any method
// named "module:function" (rpc.expose_imports).
func (a *Agent) ExposeImports(allow bool) {
	if allow {
		a.agent.Register(core.ModuleMethods, queueHandler{a})
	} else {
		a.agent.Register(core.ModuleMethods, nil)
	}
}

func checkExposedName(name string) error {
	if name == "" || name == PyMethod || strings.HasPrefix(name, core.ReservedMethodPrefix) || strings.Contains(name, "\n") {
		return fmt.Errorf("%q cannot be the name of an exposed function: it is empty, holds a newline or is reserved (%q, names starting %q)", name, PyMethod, core.ReservedMethodPrefix)
	}
	return nil
}

// CallerID is the calling worker's id.
func (r *Request) CallerID() int { return r.call.Caller.ID }

// Reply sends the message the table names back to the caller. With borrow it is sent from
// Python's memory in place, so Reply returns only once it is sent; without it Go copies it.
func (r *Request) Reply(table uintptr, nseg int, borrow bool) (err error) {
	defer recovered(&err)
	sent := r.call.Reply(segments(table, nseg, borrow))
	if borrow {
		<-sent
	}
	return nil
}

// Fail sends an error with message and the detail the table names back to the caller.
func (r *Request) Fail(message string, table uintptr, nseg int) (err error) {
	defer recovered(&err)
	r.call.Fail(core.NewRemoteError(message, segments(table, nseg, false)))
	return nil
}

// Package pybind is the only cgo boundary of tensorplay-rpc: the Go agent as gopy wraps it
// into the CPython extension tensorplay_rpc._native.
//
// Only ints, floats, bools, strings and pointers to opaque structs cross it (see DESIGN.md).
// Byte buffers cross as (address, length) pairs: Python passes a table of uint64 pairs naming
// its buffers and Go copies them before returning; for data coming in, Python allocates one
// buffer of the announced size and Go copies into it. Go never calls into Python: Python threads
// pull requests and completions with calls that block for at most a given number of
// milliseconds, so Ctrl-C still reaches Python between slices.
package pybind

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
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

// Segments is a received message as Python sees it: segment 0 is the payload, the rest are
// its out-of-band buffers.
type Segments struct {
	msg    core.Message
	agent  *Agent
	lendID int64
}

func (s *Segments) segment(i int) []byte {
	if i == 0 {
		return s.msg.Payload
	}
	return s.msg.Buffers[i-1]
}

// NumSegments is the payload plus the number of buffers.
func (s *Segments) NumSegments() int { return 1 + len(s.msg.Buffers) }

// SegmentSize is the length of segment i, or -1 if there is no such segment.
func (s *Segments) SegmentSize(i int) int {
	if i < 0 || i >= s.NumSegments() {
		return -1
	}
	return len(s.segment(i))
}

// CopySegment copies segment i to the Python buffer at addr, which holds SegmentSize(i) bytes.
func (s *Segments) CopySegment(i int, addr uintptr) (err error) {
	defer recovered(&err)
	if i < 0 || i >= s.NumSegments() {
		return fmt.Errorf("no segment %d in a message of %d", i, s.NumSegments())
	}
	src := s.segment(i)
	if len(src) > 0 {
		copy(unsafe.Slice((*byte)(pythonMemory(addr)), len(src)), src)
	}
	return nil
}

// Lend lets Python use the message's memory in place: it returns the address of its one
// buffer, where the segments lie back to back, or 0 if the message is not in one buffer.
// The memory stays valid, and Go leaves it alone, until Python calls Return.
func (s *Segments) Lend() uintptr {
	if !s.msg.Pooled() || s.msg.Size() == 0 {
		return 0
	}
	s.agent.lendMu.Lock()
	defer s.agent.lendMu.Unlock()
	if s.lendID == 0 {
		s.agent.nextLend++
		s.lendID = s.agent.nextLend
		s.agent.lent[s.lendID] = s.msg
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(s.msg.Payload)))
}

// LendID names the lent memory for Agent.Return.
func (s *Segments) LendID() int64 { return s.lendID }

// Release gives the message's memory back for reuse unless it was lent.
func (s *Segments) Release() {
	if s.lendID == 0 {
		s.msg.Release()
	}
}

// Agent is a worker's agent as Python holds it.
type Agent struct {
	agent    *core.Agent
	requests chan *Request
	events   chan *Event

	lendMu   sync.Mutex
	nextLend int64
	lent     map[int64]core.Message // memory Python uses in place, by lend id

	shutdownDone chan struct{}
	shutdownErr  error
	shutdownOnce sync.Once
}

// Starter is a join of the world under way (BeginStart).
type Starter struct {
	done   chan struct{}
	cancel context.CancelFunc
	agent  *Agent
	err    error
}

// BeginStart starts joining the world and returns at once; Wait reports when the join is
// over, Agent returns its outcome, and Cancel abandons it (as on Ctrl-C). maxMessageSize
// bounds each message sent or received (0: the default); a non-empty token is the world's
// shared secret; non-empty certFile, keyFile and caFile put the world under mutual TLS.
func BeginStart(name string, rank, worldSize int, initMethod string, initTimeoutMs int, maxMessageSize int64, token, certFile, keyFile, caFile string) *Starter {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Starter{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.done)
		defer recovered(&s.err)
		var tlsFiles *core.TLSFiles
		if certFile != "" || keyFile != "" || caFile != "" {
			tlsFiles = &core.TLSFiles{Cert: certFile, Key: keyFile, CA: caFile}
		}
		s.agent, s.err = start(ctx, name, rank, worldSize, initMethod, initTimeoutMs, maxMessageSize, token, tlsFiles)
	}()
	return s
}

// Wait waits up to timeoutMs for the join; it reports whether it is over.
func (s *Starter) Wait(timeoutMs int) bool {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case <-s.done:
		return true
	case <-t.C:
		return false
	}
}

// Cancel abandons the join: it fails with a cancellation error and releases what it held.
func (s *Starter) Cancel() {
	s.cancel()
	<-s.done
	if s.agent != nil {
		s.agent.agent.Shutdown(context.Background(), false)
		s.agent, s.err = nil, context.Canceled
	}
}

// Agent waits for the join and returns the agent, or why the world could not be joined.
func (s *Starter) Agent() (*Agent, error) {
	<-s.done
	return s.agent, s.err
}

func start(ctx context.Context, name string, rank, worldSize int, initMethod string, initTimeoutMs int, maxMessageSize int64, token string, tlsFiles *core.TLSFiles) (*Agent, error) {
	a := &Agent{
		requests:     make(chan *Request, 1<<16),
		events:       make(chan *Event, 1<<16),
		lent:         map[int64]core.Message{},
		shutdownDone: make(chan struct{}),
	}
	ag, err := core.Start(ctx, core.Config{
		Name: name, Rank: rank, WorldSize: worldSize, InitMethod: initMethod,
		InitTimeout:    time.Duration(initTimeoutMs) * time.Millisecond,
		MaxMessageSize: maxMessageSize,
		Token:          token,
		TLS:            tlsFiles,
		Handlers:       map[string]core.Handler{PyMethod: queueHandler{a}},
		OnRRefDropped: func(id core.RRefID) {
			a.post(&Event{kind: EventRRefDropped, rref: id})
		},
	})
	if err != nil {
		return nil, err
	}
	a.agent = ag
	return a, nil
}

// Return takes back memory lent to Python (Segments.Lend) once Python no longer uses it.
func (a *Agent) Return(lendID int64) {
	a.lendMu.Lock()
	msg, ok := a.lent[lendID]
	delete(a.lent, lendID)
	a.lendMu.Unlock()
	if ok {
		msg.Release()
	}
}

// Goroutines is the number of goroutines in this process (tests look for leaks with it).
func (a *Agent) Goroutines() int { return runtime.NumGoroutine() }

// Lent is the number of received messages Python still uses in place.
func (a *Agent) Lent() int {
	a.lendMu.Lock()
	defer a.lendMu.Unlock()
	return len(a.lent)
}

// Name is this worker's name.
func (a *Agent) Name() string { return a.agent.Self().Name }

// ID is this worker's rank.
func (a *Agent) ID() int { return a.agent.Self().ID }

// WorldSize is the number of workers.
func (a *Agent) WorldSize() int { return len(a.agent.Workers()) }

// WorkerName is the name of worker id, or "" if there is none.
func (a *Agent) WorkerName(id int) string {
	ws := a.agent.Workers()
	if id < 0 || id >= len(ws) {
		return ""
	}
	return ws[id].Name
}

// WorkerID is the id of the worker called name, or -1 if there is none.
func (a *Agent) WorkerID(name string) int {
	w, ok := a.agent.Worker(name)
	if !ok {
		return -1
	}
	return w.ID
}

// Call sends the message whose nseg segments the table at table names to worker to. A
// message of at least the chunk size is sent from Python's memory in place: Python keeps the
// buffers alive and unchanged until Wait reports the call done. A positive notifyID is queued
// for NextEvent when the call completes. timeoutMs <= 0 means no deadline.
func (a *Agent) Call(to int, table uintptr, nseg int, timeoutMs int, notifyID int64) (c *Call, err error) {
	defer recovered(&err)
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if timeoutMs > 0 {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(timeoutMs)*time.Millisecond)
	}
	borrow := tableSize(table, nseg) >= BorrowThreshold
	c = &Call{agent: a, future: a.agent.CallID(ctx, to, PyMethod, segments(table, nseg, borrow))}
	c.future.AfterDone(func() {
		cancel()
		if notifyID <= 0 {
			return
		}
		select {
		case <-c.future.Sent():
			a.post(&Event{kind: EventCallDone, notifyID: notifyID})
		default: // a big request still being given up on: tell Python once it is
			go func() {
				<-c.future.Sent()
				a.post(&Event{kind: EventCallDone, notifyID: notifyID})
			}()
		}
	})
	return c, nil
}

// Event kinds.
const (
	EventCallDone = iota + 1
	EventRRefDropped
)

// Event is something Python must act on: a call made with a notifyID completed, or an RRef
// this worker owns is referenced nowhere any more.
type Event struct {
	kind     int
	notifyID int64
	rref     core.RRefID
}

// Valid reports whether the event is real (gopy turns a nil *Event into an empty one).
func (e *Event) Valid() bool { return e != nil && e.kind != 0 }

// Kind is EventCallDone or EventRRefDropped.
func (e *Event) Kind() int { return e.kind }

// NotifyID is the notifyID of the completed call.
func (e *Event) NotifyID() int64 { return e.notifyID }

// RRefCreator and RRefLocal are the id of the dropped RRef.
func (e *Event) RRefCreator() int { return e.rref.Creator }

// RRefLocal: see RRefCreator.
func (e *Event) RRefLocal() int64 { return e.rref.Local }

// post queues an event without blocking the goroutine that found it.
func (a *Agent) post(e *Event) {
	select {
	case a.events <- e:
	default:
		go func() { a.events <- e }()
	}
}

// NextEvent returns the next event, or nil if none came within timeoutMs or the agent is
// shut down and no event is queued.
func (a *Agent) NextEvent(timeoutMs int) *Event {
	return receive(a.events, timeoutMs, a.shutdownDone)
}

// NewLocalID returns a number no other RRef or fork id made by this worker has; with this
// worker's id it names an RRef or a fork.
func (a *Agent) NewLocalID() int64 { return a.agent.NewRRefID().Local }

// AddFork registers a fork of an RRef with its owner before the message carrying it is sent
// (see core.Agent.AddFork).
func (a *Agent) AddFork(owner, rrefCreator int, rrefLocal int64, forkCreator int, forkLocal int64, holder int) (err error) {
	defer recovered(&err)
	return a.agent.AddFork(context.Background(), owner,
		core.RRefID{Creator: rrefCreator, Local: rrefLocal}, core.ForkID{Creator: forkCreator, Local: forkLocal}, holder)
}

// ReleaseFork tells the owner this worker dropped a fork; it does not block.
func (a *Agent) ReleaseFork(owner, rrefCreator int, rrefLocal int64, forkCreator int, forkLocal int64) {
	defer recovered(nil)
	a.agent.ReleaseFork(owner, core.RRefID{Creator: rrefCreator, Local: rrefLocal}, core.ForkID{Creator: forkCreator, Local: forkLocal})
}

// OwnedRRefs is the number of RRefs this worker owns that are referenced somewhere.
func (a *Agent) OwnedRRefs() int { return a.agent.OwnedRRefs() }

// Call is one outgoing call.
type Call struct {
	agent  *Agent
	future *core.CallFuture
}

// Wait waits up to timeoutMs for the call; it reports whether the call has completed and no
// longer uses the request's memory.
func (c *Call) Wait(timeoutMs int) bool {
	done, sent := c.future.Done(), c.future.Sent()
	select {
	case <-done:
		select {
		case <-sent:
			return true
		default:
		}
	default:
	}
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return false
	}
	select {
	case <-c.future.Sent():
		return true
	case <-t.C:
		return false
	}
}

func (c *Call) outcome() (*Segments, error) {
	msg, err := c.future.Result()
	var re *core.RemoteError
	if errors.As(err, &re) {
		msg = re.Payload
	}
	return &Segments{msg: msg, agent: c.agent}, err
}

// Status is the call's outcome kind (StatusOK, StatusRemoteError, …); it waits for the call.
func (c *Call) Status() int {
	_, err := c.outcome()
	return statusOf(err)
}

// ErrorMessage is the error's text, or "" if the call succeeded; it waits for the call.
func (c *Call) ErrorMessage() string {
	_, err := c.outcome()
	var re *core.RemoteError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &re):
		return re.Message
	default:
		return err.Error()
	}
}

// Result is the reply, or for a remote error the detail the handler attached; it waits.
func (c *Call) Result() *Segments {
	s, _ := c.outcome()
	return s
}

// queueHandler hands Python-level requests to Python's executor threads.
type queueHandler struct{ a *Agent }

func (h queueHandler) ServeRPC(call *core.ServerCall) {
	r := &Request{call: call, Segments: Segments{msg: call.Request, agent: h.a}}
	select {
	case h.a.requests <- r:
	default:
		// The queue is full: wait for room without stalling the caller's stream.
		go func() { h.a.requests <- r }()
	}
}

// NextRequest returns the next request for Python to run, or nil if none came within
// timeoutMs or the agent is shut down.
func (a *Agent) NextRequest(timeoutMs int) *Request {
	return receive(a.requests, timeoutMs, a.shutdownDone)
}

// receive takes the next item of ch, waiting at most timeoutMs and not past closed; it
// returns nil if none came.
func receive[T any](ch <-chan *T, timeoutMs int, closed <-chan struct{}) *T {
	select {
	case v := <-ch:
		return v
	default:
	}
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case v := <-ch:
		return v
	case <-t.C:
	case <-closed:
	}
	return nil
}

// Closed reports whether the agent's shutdown is complete.
func (a *Agent) Closed() bool {
	select {
	case <-a.shutdownDone:
		return true
	default:
		return false
	}
}

// Request is one incoming Python-level call.
type Request struct {
	Segments
	call *core.ServerCall
}

// Valid reports whether the request is real (gopy turns a nil *Request into an empty one).
func (r *Request) Valid() bool { return r != nil && r.call != nil }

// CallerName is the calling worker's name.
func (r *Request) CallerName() string { return r.call.Caller.Name }

// CallerID is the calling worker's id.
func (r *Request) CallerID() int { return r.call.Caller.ID }

// Reply sends the message the table names back to the caller. A big reply is sent from
// Python's memory in place, so Reply returns only once it is sent.
func (r *Request) Reply(table uintptr, nseg int) (err error) {
	defer recovered(&err)
	borrow := tableSize(table, nseg) >= BorrowThreshold
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

// BeginShutdown starts leaving the world; WaitShutdown reports when it is done. A graceful
// shutdown waits, for at most timeoutMs if it is positive, for every worker to shut down.
func (a *Agent) BeginShutdown(graceful bool, timeoutMs int) {
	a.shutdownOnce.Do(func() {
		go func() {
			defer close(a.shutdownDone)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if timeoutMs > 0 {
				ctx, cancel = context.WithTimeout(ctx, time.Duration(timeoutMs)*time.Millisecond)
			}
			defer cancel()
			a.shutdownErr = a.agent.Shutdown(ctx, graceful)
		}()
	})
}

// WaitShutdown waits up to timeoutMs for the shutdown BeginShutdown started; it reports
// whether it is done, and its error.
func (a *Agent) WaitShutdown(timeoutMs int) (bool, error) {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case <-a.shutdownDone:
		return true, a.shutdownErr
	case <-t.C:
		return false, nil
	}
}

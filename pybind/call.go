package pybind

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// Call is one outgoing call.
type Call struct {
	agent  *Agent
	future *core.CallFuture
	done   signal // fired when the future completes
	// claimed is set once Python took the reply (Take, Result); until then Discard gives
	// it back.
	claimed atomic.Bool
	// waits counts the Wait calls: only the first starts in the futex (see wait).
	waits atomic.Int32

	// A completion event is posted only for a call Python asked to be told about (Notify:
	// the future has callbacks) and only if no Python thread is in Wait for it: a thread that
	// waits settles the call itself, and waking the event thread as well costs two context
	// switches and a GIL hand-off.
	notifyMu  sync.Mutex
	notifyID  int64
	completed bool
	settled   bool // a Wait reported the call done: Python takes the outcome itself
	posted    bool // the completion event went out
	waiters   int  // threads in Wait
	eventOwed bool // the call completed while a thread waited; no event went out
}

// Wait waits up to timeoutMs for the call; it reports whether the call has completed and no
// longer uses the request's memory. When it reports true, the caller must take the outcome
// (Take, Result or Status): no completion event is posted for it. An interruptible wait (the
// main Python thread's) also returns, false, as a signal arrives (WatchInterrupts).
func (c *Call) Wait(timeoutMs int, interruptible bool) bool {
	c.notifyMu.Lock()
	c.waiters++
	c.notifyMu.Unlock()
	done := c.wait(timeoutMs, interruptible)
	c.notifyMu.Lock()
	c.waiters--
	owed := c.eventOwed && !done && c.waiters == 0
	if done || owed {
		c.eventOwed = false
	}
	if done {
		c.settled = true
	}
	c.posted = c.posted || owed
	notifyID := c.notifyID
	c.notifyMu.Unlock()
	if owed { // the call completed while this thread waited, but it gave up first
		c.postDone(notifyID)
	}
	return done
}

// Notify asks for an event with notifyID (NextEvent) once the call completes, at once if it
// already has.
func (c *Call) Notify(notifyID int64) {
	c.notifyMu.Lock()
	c.notifyID = notifyID
	post := c.completed && !c.posted && !c.settled
	c.posted = c.posted || post
	c.notifyMu.Unlock()
	if post {
		c.postDone(notifyID)
	}
}

func (c *Call) wait(timeoutMs int, interruptible bool) bool {
	d := time.Duration(timeoutMs) * time.Millisecond
	// Only a call's first wait (of some time: done() asks with 0) starts in the futex: a
	// thread back for another slice has waited a while already (see mailbox on what a futex
	// wait costs an idle process).
	var hot time.Duration
	if d > 0 && c.waits.Add(1) == 1 {
		// Reading the stream itself, where it can, the reply wakes this thread directly.
		hot = c.future.AwaitReading(min(d, hotWait))
	}
	if c.done.wait(hot) {
		select {
		case <-c.future.Sent():
			return true
		default: // a big request still being sent or given up on
		}
	}
	// A long wait (see mailbox) or a big request: on channels, without holding a P.
	t := time.NewTimer(d)
	defer t.Stop()
	return awaitClose(c.future.Done(), t.C, interruptible) && awaitClose(c.future.Sent(), t.C, interruptible)
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
		return forPython(re.Message)
	default:
		return forPython(err.Error())
	}
}

// Take waits for the call and hands its outcome to Python with one call (see Segments.Take):
// the table at sizes gets the status first. A call that failed without a message (a timeout,
// a lost peer) gives 0 segments; ErrorMessage says why.
func (c *Call) Take(sizes uintptr, tableLen int, buf uintptr, bufLen int) int {
	seg, err := c.outcome()
	status := statusOf(err)
	if status != StatusOK && status != StatusRemoteError {
		if sizes == 0 || tableLen < 1 {
			return -1
		}
		*(*int64)(pythonMemory(sizes)) = int64(status)
		return 0
	}
	n := seg.take(status, sizes, tableLen, buf, bufLen)
	if n >= 0 {
		c.claimed.Store(true) // copied and released; otherwise Result follows
	}
	return n
}

// Result is the reply, or for a remote error the detail the handler attached; it waits.
func (c *Call) Result() *Segments {
	s, _ := c.outcome()
	c.claimed.Store(true)
	return s
}

// Discard gives back the reply of a call whose future Python dropped unsettled, once it comes:
// a big one may hold shared memory its sender reuses only once it is released. A no-op once
// Python took the reply.
func (c *Call) Discard() {
	if !c.claimed.Load() {
		c.future.Discard()
	}
}

// WouldRefuse says whether a call to worker to of method, carrying size bytes, would be refused
// before any of it is sent (core.Agent.WouldRefuse).
func (a *Agent) WouldRefuse(to int, method string, size int) (refused bool) {
	defer func() {
		if recover() != nil {
			refused = false
		}
	}()
	return a.agent.WouldRefuse(to, method, int64(size)) != nil
}

// Refused reports whether the call failed before any of it was sent (core.CallFuture.Refused).
func (c *Call) Refused() bool { return c.future.Refused() }

// Abandon is Discard for a call whose request Go sends from Python's memory in place (borrow)
// and whose future Python dropped unsettled: the frame writer, or over shared memory the peer,
// may still be reading that memory, so Python keeps it until the event notifyID (NextEvent)
// says the request is no longer read, and only then lets it go.
func (c *Call) Abandon(notifyID int64) {
	c.Discard()
	c.postDone(notifyID)
}

// Call sends the message whose nseg segments the table at table names to method (PyMethod
// for a pickled Python-level message) on worker to. With
// borrow it is sent from Python's memory in place, and Python keeps the buffers alive and
// unchanged until Wait reports the call done; without it Go copies them before returning.
// timeoutMs <= 0 means no deadline.
func (a *Agent) Call(to int, method string, table uintptr, nseg int, borrow bool, timeoutMs int) (c *Call, err error) {
	defer recovered(&err)
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if timeoutMs > 0 {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(timeoutMs)*time.Millisecond)
	}
	c = &Call{agent: a, future: a.agent.CallRank(ctx, to, method, segments(table, nseg, borrow))}
	c.future.AfterDone(func() {
		cancel()
		c.notifyMu.Lock()
		c.completed = true
		notifyID := c.notifyID
		notify := notifyID > 0 && c.waiters == 0
		c.posted = c.posted || notify
		c.eventOwed = notifyID > 0 && c.waiters > 0
		c.notifyMu.Unlock()
		if notify {
			c.postDone(notifyID)
		}
		c.done.fire()
	})
	return c, nil
}

// postDone queues the call's completion event (notifyID, read under notifyMu), once its
// request's memory is no longer read.
func (c *Call) postDone(notifyID int64) {
	select {
	case <-c.future.Sent():
		c.agent.post(&Event{kind: EventCallDone, notifyID: notifyID})
	default: // a big request still being given up on: tell Python once it is
		go func() {
			<-c.future.Sent()
			c.agent.post(&Event{kind: EventCallDone, notifyID: notifyID})
		}()
	}
}

package pybind

import (
	"context"
	"errors"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// Call is one outgoing call.
type Call struct {
	agent  *Agent
	future *core.CallFuture
	done   signal // fired when the future completes
}

// Wait waits up to timeoutMs for the call; it reports whether the call has completed and no
// longer uses the request's memory.
func (c *Call) Wait(timeoutMs int) bool {
	d := time.Duration(timeoutMs) * time.Millisecond
	if c.done.wait(min(d, hotWait)) {
		select {
		case <-c.future.Sent():
			return true
		default: // a big request still being sent or given up on
		}
	}
	// A long wait (see mailbox) or a big request: on channels, without holding a P.
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.future.Done():
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
	return seg.take(status, sizes, tableLen, buf, bufLen)
}

// Result is the reply, or for a remote error the detail the handler attached; it waits.
func (c *Call) Result() *Segments {
	s, _ := c.outcome()
	return s
}

// Call sends the message whose nseg segments the table at table names to worker to. With
// borrow it is sent from Python's memory in place, and Python keeps the buffers alive and
// unchanged until Wait reports the call done; without it Go copies them before returning.
// A positive notifyID is queued for NextEvent when the call completes. timeoutMs <= 0 means
// no deadline.
func (a *Agent) Call(to int, table uintptr, nseg int, borrow bool, timeoutMs int, notifyID int64) (c *Call, err error) {
	defer recovered(&err)
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if timeoutMs > 0 {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(timeoutMs)*time.Millisecond)
	}
	c = &Call{agent: a, future: a.agent.CallRank(ctx, to, pyMethod, segments(table, nseg, borrow))}
	c.future.AfterDone(func() {
		c.done.fire()
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

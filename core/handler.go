package core

import (
	"context"
	"fmt"
	"sync"
)

// Handler serves the calls made to one method.
//
// ServeRPC runs on the goroutine that reads the caller's stream, so it must not block: it
// replies, now or later and from any goroutine, with exactly one call.Reply or call.Fail.
// [HandlerFunc] adapts an ordinary blocking function.
type Handler interface {
	ServeRPC(call *ServerCall)
}

// HandlerFunc is a blocking handler; each call runs it on a goroutine of its own. req is valid
// only until the function returns.
type HandlerFunc func(ctx context.Context, req Message) (Message, error)

// ServeRPC implements Handler.
func (f HandlerFunc) ServeRPC(call *ServerCall) {
	go func() {
		resp, err := f(call.Context(), call.Request)
		if err != nil {
			call.Fail(err)
		} else {
			<-call.Reply(resp)
		}
		call.Request.Release()
	}()
}

// ServerCall is one request being served.
type ServerCall struct {
	// Caller is the worker that made the call.
	Caller WorkerInfo
	// Method is the method called.
	Method string
	// Request is what the caller sent.
	Request Message

	ctx     context.Context
	maxSize int64
	respond func(*Frame, Message) <-chan struct{}
	once    sync.Once
}

// Context is done when the caller's deadline passes, the caller's stream breaks, or the agent
// shuts down.
func (c *ServerCall) Context() context.Context { return c.ctx }

// Reply sends resp to the caller. Only the first Reply or Fail of a call counts. The returned
// channel is closed once resp's memory is no longer read; until then it must not change. A
// reply over the size limit is replaced by an error saying so.
func (c *ServerCall) Reply(resp Message) <-chan struct{} {
	var sent <-chan struct{} = closedChan
	c.once.Do(func() {
		if size := int64(resp.Size()); size > c.maxSize {
			c.respond(&Frame{Kind: FrameResponse, Status: StatusTooLarge,
				Error: fmt.Sprintf("the reply to %q carries %d bytes, over the %d-byte limit", c.Caller.Name, size, c.maxSize)}, Message{})
			return
		}
		sent = c.respond(&Frame{Kind: FrameResponse, Status: StatusOK}, resp)
	})
	return sent
}

// Fail sends err to the caller, where it arrives as a *RemoteError with err's message and, if
// err is a *RemoteError, its payload.
func (c *ServerCall) Fail(err error) {
	c.once.Do(func() {
		f := &Frame{Kind: FrameResponse, Status: StatusHandlerError, Error: err.Error()}
		var detail Message
		if re, ok := err.(*RemoteError); ok {
			f.Error, detail = re.Message, re.Payload
		}
		<-c.respond(f, detail)
	})
}

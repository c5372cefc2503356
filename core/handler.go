package core

import (
	"context"
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

// HandlerFunc is a blocking handler; each call runs it on a goroutine of its own.
type HandlerFunc func(ctx context.Context, req Message) (Message, error)

// ServeRPC implements Handler.
func (f HandlerFunc) ServeRPC(call *ServerCall) {
	go func() {
		resp, err := f(call.Context(), call.Request)
		if err != nil {
			call.Fail(err)
			return
		}
		call.Reply(resp)
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
	respond func(*Frame)
	once    sync.Once
}

// Context is done when the caller's deadline passes, the caller's stream breaks, or the agent
// shuts down.
func (c *ServerCall) Context() context.Context { return c.ctx }

// Reply sends resp to the caller. Only the first Reply or Fail of a call counts.
func (c *ServerCall) Reply(resp Message) {
	c.once.Do(func() {
		c.respond(&Frame{Kind: FrameResponse, Status: StatusOK, Payload: resp.Payload, Buffers: resp.Buffers})
	})
}

// Fail sends err to the caller, where it arrives as a *RemoteError with err's message and, if
// err is a *RemoteError, its payload.
func (c *ServerCall) Fail(err error) {
	c.once.Do(func() {
		f := &Frame{Kind: FrameResponse, Status: StatusHandlerError, Error: err.Error()}
		if re, ok := err.(*RemoteError); ok {
			f.Error, f.Payload, f.Buffers = re.Message, re.Payload.Payload, re.Payload.Buffers
		}
		c.respond(f)
	})
}

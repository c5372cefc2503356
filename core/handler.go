package core

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// maxErrorText bounds the error text of a failed call: a response's head must fit one frame,
// and a huge message must not tear down the stream other calls share.
const maxErrorText = 64 << 10

// Handler serves the calls made to one method.
//
// ServeRPC runs on the goroutine that reads the caller's stream, so it should not block: it
// replies, now or later and from any goroutine, with exactly one call.Reply or call.Fail.
// While it blocks, the caller's stream is not read: a handler may do that to push back when
// it is full, until call.Context() ends. [HandlerFunc] adapts an ordinary blocking function.
// A panic in ServeRPC fails the call, not the worker.
//
// A big request from a worker on this host may arrive in place, in shared memory its sender
// can still write (until Release): a handler that validates its bytes and then uses them must
// copy them first. Func and the typed calls decode from a copy of their own.
type Handler interface {
	ServeRPC(call *ServerCall)
}

// HandlerFunc is a blocking handler; each call runs it on a goroutine of its own. req is valid
// only until the function returns. A panic fails the call, not the worker.
type HandlerFunc func(ctx context.Context, req Message) (Message, error)

// ServeRPC implements Handler.
func (f HandlerFunc) ServeRPC(call *ServerCall) {
	go func() {
		defer func() {
			if r := recover(); r != nil {
				reportPanic(call.log, call.Caller.Name, "running the handler of "+truncateText(call.Method, maxMethodName), r, call.Fail)
				call.Request.Release()
			}
		}()
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
	log     *slog.Logger
	respond func(*wire.Frame, Message) <-chan struct{}
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
			c.respond(&wire.Frame{Kind: wire.FrameResponse, Status: wire.ReplyTooLarge,
				Error: fmt.Sprintf("the reply to %q carries %d bytes, over the %d-byte limit", c.Caller.Name, size, c.maxSize)}, Message{})
			return
		}
		sent = c.respond(&wire.Frame{Kind: wire.FrameResponse, Status: wire.ReplyOK}, resp)
	})
	return sent
}

// Fail sends err to the caller, where it arrives as a *RemoteError with err's message and, if
// err is a *RemoteError, its payload.
func (c *ServerCall) Fail(err error) {
	c.once.Do(func() {
		f := &wire.Frame{Kind: wire.FrameResponse, Status: wire.ReplyHandlerError, Error: err.Error()}
		var detail Message
		if re, ok := err.(*RemoteError); ok {
			f.Error, detail = re.Message, re.Payload
		}
		f.Error = truncateText(f.Error, maxErrorText)
		if size := int64(detail.Size()); size > c.maxSize {
			f.Error = truncateText(fmt.Sprintf("%s (its %d-byte detail was over the %d-byte limit and was left out)", f.Error, size, c.maxSize), maxErrorText)
			detail = Message{}
		}
		<-c.respond(f, detail)
	})
}

// truncateText returns s cut to at most limit bytes, keeping its head and its tail (where a
// traceback says what happened) around a note of what was left out.
func truncateText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	note := fmt.Sprintf("\n[... %d bytes left out ...]\n", len(s)-limit)
	keep := max(0, limit-len(note))
	head := keep / 2
	return strings.ToValidUTF8(s[:head]+note+s[len(s)-(keep-head):], "")
}

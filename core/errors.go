package core

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by the agent wrap one of these, so callers test them with
// errors.Is; their messages name the worker concerned.
var (
	// ErrTimeout: a call ran past its deadline.
	ErrTimeout = errors.New("RPC timed out")
	// ErrPeerLost: the stream to the callee broke, or it could not be reached.
	ErrPeerLost = errors.New("connection to peer lost")
	// ErrUnknownWorker: the destination names no worker of the world.
	ErrUnknownWorker = errors.New("unknown destination worker")
	// ErrShutdown: the agent is shut down or shutting down.
	ErrShutdown = errors.New("RPC agent is shut down")
	// ErrShutdownTimedOut: a graceful Shutdown's context ended before every worker reached
	// its barrier (or this worker's own calls completed); the agent is closed all the same.
	ErrShutdownTimedOut = errors.New("graceful shutdown timed out")
	// ErrNoHandler: the callee has no handler registered for the method.
	ErrNoHandler = errors.New("no handler for method")
	// ErrRendezvous: the world could not be formed.
	ErrRendezvous = errors.New("rendezvous failed")
	// ErrCanceled: the caller's context was canceled before the reply came.
	ErrCanceled = errors.New("RPC canceled")
	// ErrWorkerLeft: the destination left a dynamic world (or its process died and was
	// dropped from it).
	ErrWorkerLeft = errors.New("left the world")
	// ErrTooLarge: a message is over the size limit.
	ErrTooLarge = errors.New("message too large")
)

// DuplicateNameError: two workers of a world joined under one name. It is a rendezvous
// failure (errors.Is(err, ErrRendezvous)); its message is torch's own words, which scripts
// match on.
type DuplicateNameError struct {
	Name         string
	First, Later int // the two ranks
}

func (e *DuplicateNameError) Error() string {
	return fmt.Sprintf("RPC worker name %s is not unique. Workers %d and %d share the same name.", e.Name, e.First, e.Later)
}

// Unwrap makes the error a rendezvous failure.
func (e *DuplicateNameError) Unwrap() error { return ErrRendezvous }

// RemoteError is a handler's failure, delivered to the caller.
type RemoteError struct {
	// Worker is the callee's name.
	Worker string
	// Message is the handler's error text.
	Message string
	// Payload is extra detail the handler attached (the Python binding puts the pickled
	// exception there); it may be empty.
	Payload Message
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("on worker %q: %s", e.Worker, e.Message)
}

// NewRemoteError makes the error a handler fails with to send detail beside the message.
func NewRemoteError(message string, detail Message) *RemoteError {
	return &RemoteError{Message: message, Payload: detail}
}

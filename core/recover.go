package core

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// ErrInternal: a bug in the agent or a handler (a recovered panic) failed the call or stream.
var ErrInternal = errors.New("internal error")

// reportPanic handles r, a panic recovered on a goroutine that handles a peer's input: a Go
// panic would abort the whole process, a Python worker with all its work, so it becomes an
// error instead. It is logged with the peer's name and handed to onPanic, if set, to fail the
// call or stream concerned. Call it as
//
//	defer func() {
//		if r := recover(); r != nil {
//			reportPanic(log, peer, "doing what", r, onPanic)
//		}
//	}()
func reportPanic(log *slog.Logger, peer, what string, r any, onPanic func(error)) {
	err := fmt.Errorf("%w: panic while %s: %v", ErrInternal, what, r)
	log.Error("tensorplay-rpc: recovered from a panic", "peer", peer, "while", what, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	if onPanic != nil {
		onPanic(err)
	}
}

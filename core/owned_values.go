package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// The values of RRefs a Go worker owns: a Python worker's
// remote(go_worker, remote_function(name), args) runs this worker's handler name and keeps its
// reply here under the RRef's id, and to_here() fetches it. The forks are counted as for every
// owner (rref.go); the value goes with the last.
const (
	// ReservedMethodPrefix starts the names of the core's own methods.
	ReservedMethodPrefix = "_tensorplay/"
	// RemoteMethod runs a handler and keeps its reply as an RRef's value. Its payload is the
	// msgpack array [creator, local, method] of the RRef's id and the handler, followed by
	// the call's own payload (the msgpack array of its arguments); its buffers are the call's.
	RemoteMethod = "_tensorplay/remote"
	// FetchMethod answers with an RRef's value; its payload is the msgpack array
	// [creator, local].
	FetchMethod = "_tensorplay/fetch"
)

// ownedValue is one RRef's value, or its creation's failure, once ready is closed.
type ownedValue struct {
	ready chan struct{}
	msg   Message // the handler's reply, in memory of its own
	err   error
	// stop ends the handler's context: the RRef is dropped, no one will read the value.
	stop context.CancelFunc
}

// ownedValues are the values of the RRefs this worker owns.
type ownedValues struct {
	mu sync.Mutex
	m  map[wire.RRefID]*ownedValue
}

// create makes the slot of a new RRef, or says why it cannot.
// create publishes a slot for id's value; stop, set before the slot is published (a release
// may drop it at once), ends its making when the value is dropped.
func (v *ownedValues) create(id wire.RRefID, stop context.CancelFunc) (*ownedValue, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[wire.RRefID]*ownedValue{}
	}
	if v.m[id] != nil {
		return nil, fmt.Errorf("an RRef %v exists already", id)
	}
	slot := &ownedValue{ready: make(chan struct{}), stop: stop}
	v.m[id] = slot
	return slot, nil
}

func (v *ownedValues) get(id wire.RRefID) *ownedValue {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.m[id]
}

// drop forgets the value of id, whose last fork is gone, and reports whether it held one.
func (v *ownedValues) drop(id wire.RRefID) bool {
	v.mu.Lock()
	slot := v.m[id]
	delete(v.m, id)
	v.mu.Unlock()
	if slot != nil && slot.stop != nil {
		slot.stop()
	}
	return slot != nil
}

// count is the number of values kept.
func (v *ownedValues) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.m)
}

// rrefDropped is called when the last fork of an RRef this worker owns is gone.
func (a *Agent) rrefDropped(id wire.RRefID) {
	if !a.values.drop(id) && a.onRRefDropped != nil { // a value kept here is no one else's
		a.onRRefDropped(id)
	}
}

// remoteHandler serves RemoteMethod.
type remoteHandler struct{ a *Agent }

func (h remoteHandler) ServeRPC(call *ServerCall) {
	a := h.a
	req := call.Request
	r := bytes.NewReader(req.Payload)
	id, method, err := decodeRemoteHead(msgpack.NewDecoder(r))
	if err != nil {
		req.Release()
		call.Fail(fmt.Errorf("a remote() request: %w", err))
		return
	}
	if strings.HasPrefix(method, ReservedMethodPrefix) || a.handler(method) == nil {
		req.Release()
		call.Fail(fmt.Errorf("remote() of %q: this worker serves no such function", truncateText(method, maxMethodName)))
		return
	}
	// Only the RRef's creator makes it, once its fork is registered (the fork travels ahead
	// of the request): a value no fork holds would never be dropped.
	if id.Creator != call.Caller.ID || !a.refs.hasForks(id) {
		req.Release()
		call.Fail(fmt.Errorf("remote() of %q: RRef (created_on=%d, local_id=%d) is not one of worker %q with a fork registered here", truncateText(method, maxMethodName), id.Creator, id.Local, call.Caller.Name))
		return
	}
	// The caller may stop waiting for the confirmation (its deadline): its call, and the slot
	// it holds in this worker's service, end then; the value is still made, as torch's owner
	// makes it, until the RRef is dropped.
	if a.beforeCreate != nil {
		a.beforeCreate(id)
	}
	ctx, stop := context.WithCancel(a.serveCtx)
	slot, err := a.values.create(id, stop)
	if err != nil {
		stop()
		req.Release()
		call.Fail(err)
		return
	}
	// A release applied between the check above and create found no value to drop: look again,
	// now that the slot is there for the next one to find.
	if !a.refs.hasForks(id) {
		a.values.drop(id)
		req.Release()
		call.Fail(fmt.Errorf("remote() of %q: RRef (created_on=%d, local_id=%d) was released before it was made", truncateText(method, maxMethodName), id.Creator, id.Local))
		return
	}
	giveUp := context.AfterFunc(call.Context(), func() {
		call.Fail(fmt.Errorf("%w: the caller stopped waiting for the creation of RRef (created_on=%d, local_id=%d)", ErrCanceled, id.Creator, id.Local))
	})
	args := Message{Payload: req.Payload[len(req.Payload)-r.Len():], Buffers: req.Buffers}
	frame := &wire.Frame{Kind: wire.FrameRequest, Method: method}
	// The value is made even if the caller stops waiting for the confirmation, as torch's owner
	// makes it: its forks are registered, and to_here() may still ask for it.
	a.dispatch(ctx, call.Caller, frame, args, func(resp *wire.Frame, m Message) <-chan struct{} {
		giveUp()
		reply, err := responseResult(resp, m, a.self.Name)
		if re, ok := err.(*RemoteError); ok {
			err = &RemoteError{Worker: re.Worker, Message: re.Message, Payload: re.Payload.plainCopy()}
		}
		slot.msg, slot.err = reply.plainCopy(), err
		close(slot.ready)
		req.Release()
		if err != nil {
			call.Fail(err)
		} else {
			call.Reply(Message{Payload: msgpackNil})
		}
		return closedChan
	})
}

// decodeRemoteHead reads the [creator, local, method] that starts a RemoteMethod request, by
// hand: nothing in it is allocated by a length it claims.
func decodeRemoteHead(dec *msgpack.Decoder) (id wire.RRefID, method string, err error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return id, "", err
	}
	if n != 3 {
		return id, "", fmt.Errorf("its head has %d items, want 3 (creator, local, method)", n)
	}
	if id.Creator, err = dec.DecodeInt(); err != nil {
		return id, "", err
	}
	if id.Local, err = dec.DecodeInt64(); err != nil {
		return id, "", err
	}
	raw, err := dec.DecodeBytesLen()
	if err != nil {
		return id, "", err
	}
	if raw < 0 || raw > maxMethodName {
		return id, "", fmt.Errorf("its method name is %d bytes long, want at most %d", raw, maxMethodName)
	}
	b := make([]byte, raw)
	if err := dec.ReadFull(b); err != nil {
		return id, "", err
	}
	return id, string(b), nil
}

// msgpackNil is the msgpack encoding of nil: the confirmation of an RRef's creation.
var msgpackNil = []byte{0xc0}

// fetchHandler serves FetchMethod.
type fetchHandler struct{ a *Agent }

func (h fetchHandler) ServeRPC(call *ServerCall) {
	var id struct {
		_msgpack struct{} `msgpack:",as_array"`
		Creator  int
		Local    int64
	}
	err := checkMsgpack(call.Request.Payload)
	if err == nil {
		err = msgpack.Unmarshal(call.Request.Payload, &id)
	}
	call.Request.Release()
	if err != nil {
		call.Fail(fmt.Errorf("a fetch of an RRef's value: %w", err))
		return
	}
	slot := h.a.values.get(wire.RRefID{Creator: id.Creator, Local: id.Local})
	if slot == nil {
		call.Fail(fmt.Errorf("worker %q has no RRef (created_on=%d, local_id=%d): it was never made here, or every reference to it is gone", h.a.self.Name, id.Creator, id.Local))
		return
	}
	go func() {
		select {
		case <-slot.ready:
		case <-call.Context().Done():
			call.Fail(call.Context().Err())
			return
		}
		if slot.err != nil {
			var re *RemoteError
			if errors.As(slot.err, &re) {
				call.Fail(NewRemoteError(re.Message, re.Payload))
			} else {
				call.Fail(slot.err)
			}
			return
		}
		call.Reply(slot.msg) // kept until the RRef is dropped, and never released: no copy
	}()
}

// OwnedValues is the number of RRef values this Go worker keeps for remote() calls made to it.
func (a *Agent) OwnedValues() int { return a.values.count() }

// plainCopy is m in memory of its own, which is never released.
func (m Message) plainCopy() Message {
	c := Message{Payload: append([]byte(nil), m.Payload...)}
	for _, b := range m.Buffers {
		c.Buffers = append(c.Buffers, append([]byte(nil), b...))
	}
	m.Release()
	return c
}

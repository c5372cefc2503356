package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"
)

// Calls between languages carry msgpack values: a request's payload is the msgpack array of
// the call's arguments, in order, and a reply's payload the msgpack encoding of the result;
// the data of each Array in them travels in a buffer of the message, beside the msgpack.
// Python workers speak it for the functions they expose (rpc.expose) and for the Go handlers
// they call (rpc.remote_function); Func and CallFunc speak it in Go.

var (
	contextType = reflect.TypeFor[context.Context]()
	errorType   = reflect.TypeFor[error]()
)

// Func adapts a plain Go function to a Handler that Python workers (rpc.remote_function) and
// CallFunc can call. f's first parameter is a context.Context, done when the caller gives up;
// its other parameters take the call's arguments in order, decoded from msgpack; it returns
// a result and an error, or only an error (the reply is then nil). A call with the wrong
// number of arguments, or one that does not decode into its parameter's type, fails naming
// it. Func panics if f is not such a function: that is a mistake in the program, found when
// it registers the handler.
func Func(f any) Handler {
	fn := reflect.ValueOf(f)
	t := fn.Type()
	if t.Kind() != reflect.Func || t.NumIn() == 0 || t.In(0) != contextType || t.IsVariadic() ||
		t.NumOut() == 0 || t.NumOut() > 2 || t.Out(t.NumOut()-1) != errorType {
		panic(fmt.Sprintf("core.Func: %s is not a func(context.Context, args...) (result, error) or func(context.Context, args...) error", t))
	}
	return HandlerFunc(func(ctx context.Context, req Message) (Message, error) {
		in, err := decodeArgs(t, req)
		if err != nil {
			return Message{}, err
		}
		in[0] = reflect.ValueOf(ctx)
		out := fn.Call(in)
		if err, _ := out[len(out)-1].Interface().(error); err != nil {
			return Message{}, err
		}
		var result any
		if len(out) == 2 {
			result = out[0].Interface()
		}
		reply, err := encodeValue(result)
		if err != nil {
			return Message{}, fmt.Errorf("the result (a %s) cannot be sent as msgpack: %w", out[0].Type(), err)
		}
		return reply, nil
	})
}

// decodeArgs decodes a call's msgpack array of arguments into the parameters of t after its
// context; in[0] is left for the context.
func decodeArgs(t reflect.Type, req Message) ([]reflect.Value, error) {
	dec, done, err := newDecoder(req)
	if err != nil {
		return nil, fmt.Errorf("the arguments: %w", err)
	}
	defer done()
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("the arguments are not a msgpack array: %w", err)
	}
	if n < 0 {
		return nil, errors.New("the arguments are nil, not a msgpack array")
	}
	if want := t.NumIn() - 1; n != want {
		return nil, fmt.Errorf("takes %d argument(s), got %d", want, n)
	}
	in := make([]reflect.Value, t.NumIn())
	for i := 1; i < t.NumIn(); i++ {
		v := reflect.New(t.In(i))
		if err := dec.DecodeValue(v); err != nil {
			return nil, fmt.Errorf("argument %d does not decode into %s: %w", i, t.In(i), err)
		}
		in[i] = v.Elem()
	}
	return in, nil
}

// CallFunc calls method on worker to with args, sent as msgpack, and decodes the result into
// an R: the way to call a Func handler, or a function a Python worker exposes (rpc.expose).
// An exception the Python function raised comes back as a *PythonError; a Go handler's error
// as a *RemoteError.
func CallFunc[R any](ctx context.Context, a *Agent, to, method string, args ...any) (R, error) {
	var result R
	if args == nil {
		args = []any{} // an array, not nil
	}
	req, err := encodeValue(args)
	if err != nil {
		return result, fmt.Errorf("the arguments to %q cannot be sent as msgpack: %w", method, err)
	}
	resp, err := a.Call(ctx, to, method, req)
	if err != nil {
		var re *RemoteError
		if errors.As(err, &re) && re.Payload.Pooled() {
			// Its detail may live in the sender's shared memory, which stays the sender's
			// (and keeps the region mapped) until released: the error keeps a copy.
			landed := re.Payload
			re.Payload = landed.ownCopy()
			landed.Release()
		}
		return result, pythonError(err)
	}
	if resp.Pooled() {
		// A big result may live in its sender's shared memory, which the sender reuses once
		// it is released: the result's Arrays get memory of their own.
		own := resp.ownCopy()
		resp.Release()
		resp = own
	}
	dec, done, err := newDecoder(resp)
	if err != nil {
		return result, fmt.Errorf("the result of %q on worker %q: %w", method, to, err)
	}
	err = dec.Decode(&result)
	if arrays := done(); arrays == 0 {
		resp.Release() // no Array of the result points into it
	}
	if err != nil {
		return result, fmt.Errorf("the result of %q on worker %q does not decode into %T: %w", method, to, result, err)
	}
	return result, nil
}

// encodeValue encodes v as a message: v in msgpack in its payload, and the data of each Array
// in v in a buffer of its own.
func encodeValue(v any) (Message, error) {
	var payload bytes.Buffer
	enc := msgpack.NewEncoder(&payload)
	var buffers [][]byte
	encodingBuffers.Store(enc, &buffers)
	defer encodingBuffers.Delete(enc)
	if err := enc.Encode(v); err != nil {
		return Message{}, err
	}
	return Message{Payload: payload.Bytes(), Buffers: buffers}, nil
}

// newDecoder is a decoder of msg's payload, checked (checkMsgpack), whose Arrays find their
// data in msg's buffers; done forgets it and says how many Arrays it decoded. It decodes a
// private copy of the payload: a big message received over shared memory lies in memory its
// sender can still write, and bytes changed between the check and the decoding could claim a
// slice of any length, which msgpack allocates at once.
func newDecoder(msg Message) (dec *msgpack.Decoder, done func() (arrays int), err error) {
	payload := bytes.Clone(msg.Payload)
	if err := checkMsgpack(payload); err != nil {
		return nil, nil, err
	}
	dec = msgpack.NewDecoder(bytes.NewReader(payload))
	d := &decoding{buffers: msg.Buffers}
	decodingBuffers.Store(dec, d)
	return dec, func() int {
		decodingBuffers.Delete(dec)
		return d.arrays
	}, nil
}

// PythonError is an exception raised by a Python function that a Go program called.
type PythonError struct {
	// Worker is the name of the worker the function ran on.
	Worker string
	// Type is the exception's class name, Message its text, Traceback the remote traceback.
	Type, Message, Traceback string

	remote *RemoteError
}

func (e *PythonError) Error() string {
	return fmt.Sprintf("on worker %q: %s: %s", e.Worker, e.Type, e.Message)
}

// Unwrap returns the RemoteError the exception came in.
func (e *PythonError) Unwrap() error { return e.remote }

// pythonErrorDetail is the detail a Python worker attaches to the failure of an exposed
// function, in msgpack.
type pythonErrorDetail struct {
	Type      string `msgpack:"type"`
	Message   string `msgpack:"message"`
	Traceback string `msgpack:"traceback"`
}

// maxErrorDetail bounds the error detail read into a PythonError (a traceback is far shorter).
const maxErrorDetail = 4 << 20

// pythonError turns a RemoteError that carries a Python exception into a *PythonError.
func pythonError(err error) error {
	var re *RemoteError
	if !errors.As(err, &re) || len(re.Payload.Payload) == 0 || len(re.Payload.Payload) > maxErrorDetail {
		return err
	}
	var d pythonErrorDetail
	if checkMsgpack(re.Payload.Payload) != nil || msgpack.Unmarshal(re.Payload.Payload, &d) != nil || d.Type == "" {
		return err
	}
	return &PythonError{Worker: re.Worker, Type: d.Type, Message: d.Message, Traceback: d.Traceback, remote: re}
}

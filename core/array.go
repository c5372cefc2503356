package core

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
)

// ArrayExt is the msgpack extension type of an Array. Its data is the msgpack array
// [dtype, shape, where]: where is the index of the message buffer holding the elements (the
// data travels beside the msgpack stream, never copied into it), or the elements themselves as
// bytes when the Array was encoded outside a call.
const ArrayExt = 1

// Array is an n-dimensional array of numbers that crosses languages in place: numpy arrays and
// torch CPU tensors from Python arrive as Arrays, and Arrays sent to Python arrive as numpy
// arrays. An Array received as an argument of a Func handler is valid until the handler
// returns; one received as a CallFunc result until garbage collected.
type Array struct {
	// DType is numpy's name of the element type: "float32", "float64", "int8" to "int64",
	// "uint8" to "uint64", or "bool".
	DType string
	// Shape is the length of each dimension; the elements are in C order.
	Shape []int
	// Data holds the elements, little-endian.
	Data []byte
}

// Element is a type an Array's elements can have in Go.
type Element interface {
	float32 | float64 | int8 | int16 | int32 | int64 | uint8 | uint16 | uint32 | uint64 | bool
}

// dtypeSizes is the size of an element of each dtype an Array may have.
var dtypeSizes = map[string]int{
	"float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
	"uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}

// dtypeOf is numpy's name for T.
func dtypeOf[T Element]() string {
	var zero T
	switch any(zero).(type) {
	case float32:
		return "float32"
	case float64:
		return "float64"
	case int8:
		return "int8"
	case int16:
		return "int16"
	case int32:
		return "int32"
	case int64:
		return "int64"
	case uint8:
		return "uint8"
	case uint16:
		return "uint16"
	case uint32:
		return "uint32"
	case uint64:
		return "uint64"
	default:
		return "bool"
	}
}

// ArrayOf is an Array over data, without copying it; with no shape it is one-dimensional.
// data must not change until the call that sends it returns.
func ArrayOf[T Element](data []T, shape ...int) Array {
	if len(shape) == 0 {
		shape = []int{len(data)}
	}
	var raw []byte
	if len(data) > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), len(data)*int(unsafe.Sizeof(data[0])))
	}
	return Array{DType: dtypeOf[T](), Shape: shape, Data: raw}
}

// Elements is a's elements as a []T over a's own memory (received Arrays and those of ArrayOf
// are aligned for T; an Array built by hand with misaligned Data gets a copy); an error if a's
// dtype is not T's.
func Elements[T Element](a Array) ([]T, error) {
	if want := dtypeOf[T](); a.DType != want {
		return nil, fmt.Errorf("the array holds %s, not %s", a.DType, want)
	}
	var zero T
	size := int(unsafe.Sizeof(zero))
	n := len(a.Data) / size
	if n == 0 {
		return []T{}, nil
	}
	if uintptr(unsafe.Pointer(&a.Data[0]))%unsafe.Alignof(zero) != 0 {
		out := make([]T, n)
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), n*size), a.Data)
		return out, nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&a.Data[0])), n), nil
}

// check reports whether a is consistent: a known dtype, and as many bytes as its shape says.
func (a Array) check() error {
	size, ok := dtypeSizes[a.DType]
	if !ok {
		return fmt.Errorf("an array of dtype %.32q: want one of float32, float64, int8-int64, uint8-uint64, bool", a.DType)
	}
	count := 1
	for _, d := range a.Shape {
		if d < 0 || (d > 0 && count > math.MaxInt/size/d) {
			return fmt.Errorf("an array of shape %v", a.Shape)
		}
		count *= d
	}
	if count*size != len(a.Data) {
		return fmt.Errorf("an array of shape %v and dtype %s needs %d bytes, has %d", a.Shape, a.DType, count*size, len(a.Data))
	}
	if a.DType == "bool" {
		// A Go bool must be 0 or 1: any other byte read as one is undefined.
		for i, b := range a.Data {
			if b > 1 {
				return fmt.Errorf("a bool array holds byte %d at %d: want 0 or 1", b, i)
			}
		}
	}
	return nil
}

// The buffers of the message being encoded or decoded, by its encoder or decoder: msgpack's
// custom coders get nothing but those.
var (
	encodingBuffers sync.Map // *msgpack.Encoder -> *[][]byte
	decodingBuffers sync.Map // *msgpack.Decoder -> *decoding
)

type decoding struct {
	buffers [][]byte
	arrays  int // the arrays decoded, which point into the buffers
}

// EncodeMsgpack implements msgpack.CustomEncoder.
func (a Array) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := a.check(); err != nil {
		return err
	}
	var where any = a.Data
	if b, ok := encodingBuffers.Load(enc); ok {
		buffers := b.(*[][]byte)
		where = len(*buffers)
		*buffers = append(*buffers, a.Data)
	}
	head, err := msgpack.Marshal([]any{a.DType, a.Shape, where})
	if err != nil {
		return err
	}
	if err := enc.EncodeExtHeader(ArrayExt, len(head)); err != nil {
		return err
	}
	_, err = enc.Writer().Write(head)
	return err
}

// DecodeMsgpack implements msgpack.CustomDecoder.
func (a *Array) DecodeMsgpack(dec *msgpack.Decoder) error {
	code, n, err := dec.DecodeExtHeader()
	if err != nil {
		return err
	}
	if code != ArrayExt {
		return fmt.Errorf("msgpack extension %d is not an array (%d)", code, ArrayExt)
	}
	return a.decodeBody(dec, n)
}

// An Array decoded into an interface value (a CallFunc[any] result, a map[string]any) is an
// Array too.
func init() {
	msgpack.RegisterExtDecoder(ArrayExt, Array{}, func(dec *msgpack.Decoder, v reflect.Value, n int) error {
		return v.Addr().Interface().(*Array).decodeBody(dec, n)
	})
}

// decodeBody decodes the n bytes of an array's extension data.
func (a *Array) decodeBody(dec *msgpack.Decoder, n int) error {
	if n > maxArrayHead {
		return fmt.Errorf("an array's head of %d bytes, more than %d", n, maxArrayHead)
	}
	head := make([]byte, n)
	if err := dec.ReadFull(head); err != nil {
		return err
	}
	var parts struct {
		_msgpack struct{} `msgpack:",as_array"`
		DType    string
		Shape    []int
		Where    any
	}
	if err := checkMsgpack(head); err != nil {
		return fmt.Errorf("an array's head: %w", err)
	}
	if err := msgpack.Unmarshal(head, &parts); err != nil {
		return fmt.Errorf("an array's head: %w", err)
	}
	a.DType, a.Shape = parts.DType, parts.Shape
	switch where := parts.Where.(type) {
	case []byte:
		a.Data = where
	default:
		i, ok := toIndex(where)
		d, known := decodingBuffers.Load(dec)
		if !ok || !known {
			return errors.New("an array's data is neither inline nor a buffer of the message")
		}
		dd := d.(*decoding)
		if i >= len(dd.buffers) {
			return fmt.Errorf("an array's data is buffer %d of a message of %d", i, len(dd.buffers))
		}
		a.Data = dd.buffers[i]
		if a.DType == "bool" {
			// Checked below for bytes other than 0 and 1, which the sender must not be able
			// to write afterwards (its buffer may be shared memory it still writes).
			a.Data = bytes.Clone(a.Data)
		}
		dd.arrays++
	}
	if err := a.check(); err != nil {
		return err
	}
	a.Data = aligned(a.Data, dtypeSizes[a.DType])
	return nil
}

// aligned is data, or a copy of it if it does not start at a multiple of size (at most 8): a
// received message's buffers follow its payload in one allocation, wherever the payload
// ends, and Elements must give a slice over the Array's own memory, not over a copy of it.
func aligned(data []byte, size int) []byte {
	if len(data) == 0 || uintptr(unsafe.Pointer(&data[0]))%uintptr(size) == 0 {
		return data
	}
	words := make([]uint64, (len(data)+7)/8) // 8-aligned
	out := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(data))
	copy(out, data)
	return out
}

// maxArrayHead bounds an array's head (its dtype, shape and buffer index).
const maxArrayHead = 4 << 10

func toIndex(v any) (int, bool) {
	switch i := v.(type) {
	case int8:
		return int(i), i >= 0
	case int16:
		return int(i), i >= 0
	case int32:
		return int(i), i >= 0
	case int64:
		return int(i), i >= 0 && i <= math.MaxInt32
	case uint8:
		return int(i), true
	case uint16:
		return int(i), true
	case uint32:
		return int(i), i <= math.MaxInt32
	case uint64:
		return int(i), i <= math.MaxInt32
	}
	return 0, false
}

package core

import "github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"

// Message is what a call carries each way: an opaque payload and optional out-of-band buffers
// (the Python binding sends a pickle as Payload and its protocol-5 buffers as Buffers).
type Message struct {
	Payload []byte
	Buffers [][]byte

	// release returns the pooled memory a received message lives in: one buffer for a big one
	// (then lendable), for one received in a frame the buffers its long payload and buffers
	// were decoded into (wire.Frame.TakeRecycle), which are not back to back.
	release  func()
	lendable bool
}

// Release hands the memory of a received message back for reuse; Payload and Buffers must not
// be used afterwards. It is a no-op for messages that were not received. It is optional
// (unreleased memory is garbage collected), but a big message received over shared memory may
// live in its sender's landing area: until it is released the sender does not reuse that
// memory (it sends the slower way when the area is full) and the region stays mapped.
func (m Message) Release() {
	if m.release != nil {
		m.release()
	}
}

// Pooled reports whether the message lives in one pooled buffer (it was received in chunks):
// its payload and buffers are then slices of one allocation that stays valid until Release.
func (m Message) Pooled() bool { return m.lendable }

// Size is the number of payload and buffer bytes in m.
func (m Message) Size() int {
	n := len(m.Payload)
	for _, b := range m.Buffers {
		n += len(b)
	}
	return n
}

// ownCopy returns m in memory of its own. A call to this worker itself hands its handler and
// its caller such copies, as a remote call does: the handler may start after its caller gave up
// and reused the request's memory, the caller reads the reply after the handler let go of it,
// and neither may change what the other holds.
func (m Message) ownCopy() Message {
	sizes := make([]int64, 0, 1+len(m.Buffers))
	var buf []byte
	var release func()
	if size := m.Size(); size >= bufpool.MinPooled {
		buf = bufpool.Shared.Get(size)[:0]
		release = bufpool.Shared.PutOnce(buf[:size])
	}
	for _, b := range append([][]byte{m.Payload}, m.Buffers...) {
		buf = append(buf, b...)
		sizes = append(sizes, int64(len(b)))
	}
	return cutMessage(buf, sizes, release)
}

// cutMessage makes a message of the segments buf holds back to back, sizes[0] bytes of
// payload then each buffer's; release, if set, hands buf back.
func cutMessage(buf []byte, sizes []int64, release func()) Message {
	msg := Message{release: release, lendable: release != nil}
	at := int64(0)
	for i, n := range sizes {
		seg := buf[at : at+n : at+n]
		at += n
		if i == 0 {
			msg.Payload = seg
		} else {
			msg.Buffers = append(msg.Buffers, seg)
		}
	}
	return msg
}

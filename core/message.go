package core

// Message is what a call carries each way: an opaque payload and optional out-of-band buffers
// (the Python binding sends a pickle as Payload and its protocol-5 buffers as Buffers).
type Message struct {
	Payload []byte
	Buffers [][]byte

	// release returns the pooled memory a received big message lives in.
	release func()
}

// Release hands the memory of a received message back for reuse; Payload and Buffers must not
// be used afterwards. It is optional (unreleased memory is garbage collected) and a no-op for
// messages not received in chunks.
func (m Message) Release() {
	if m.release != nil {
		m.release()
	}
}

// Pooled reports whether the message lives in one pooled buffer (it was received in chunks):
// its payload and buffers are then slices of one allocation that stays valid until Release.
func (m Message) Pooled() bool { return m.release != nil }

// Size is the number of payload and buffer bytes in m.
func (m Message) Size() int {
	n := len(m.Payload)
	for _, b := range m.Buffers {
		n += len(b)
	}
	return n
}

// ownCopyAbove is the size from which an own copy lives in one pooled buffer, lent in place as
// a received big message is; below it a plain allocation is cheaper.
const ownCopyAbove = 64 << 10

// ownCopy returns m in memory of its own. A call to this worker itself hands its handler and
// its caller such copies, as a remote call does: the handler may start after its caller gave up
// and reused the request's memory, the caller reads the reply after the handler let go of it,
// and neither may change what the other holds.
func (m Message) ownCopy() Message {
	size := m.Size()
	var out Message
	var buf []byte
	if size >= ownCopyAbove {
		buf = pool.Get(size)
		out.release = releaseOnce(buf)
	} else {
		buf = make([]byte, size)
	}
	at := 0
	cut := func(b []byte) []byte {
		n := copy(buf[at:], b)
		seg := buf[at : at+n : at+n]
		at += n
		return seg
	}
	out.Payload = cut(m.Payload)
	for _, b := range m.Buffers {
		out.Buffers = append(out.Buffers, cut(b))
	}
	return out
}

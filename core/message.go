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

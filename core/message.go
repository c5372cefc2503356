package core

// Message is what a call carries each way: an opaque payload and optional out-of-band buffers
// (the Python binding sends a pickle as Payload and its protocol-5 buffers as Buffers).
type Message struct {
	Payload []byte
	Buffers [][]byte
}

// Size is the number of payload and buffer bytes in m.
func (m Message) Size() int {
	n := len(m.Payload)
	for _, b := range m.Buffers {
		n += len(b)
	}
	return n
}

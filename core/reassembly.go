package core

import (
	"fmt"

	"github.com/tensorplay/tensorplay-rpc/core/internal/bufpool"
)

// maxBuffersPerMessage bounds how many buffers a message may announce.
const maxBuffersPerMessage = 1 << 16

var pool bufpool.Pool

// reassembler rebuilds the chunked messages arriving on one stream direction. Announced sizes
// are checked against the limit before anything is allocated.
type reassembler struct {
	maxSize  int64
	messages map[uint64]*inMessage
}

type inMessage struct {
	header   *Frame
	buf      []byte
	received int64
}

func newReassembler(maxSize int64) *reassembler {
	return &reassembler{maxSize: maxSize, messages: map[uint64]*inMessage{}}
}

// add takes one frame; it returns a frame ready to handle (the frame itself when it is not
// chunked, or the completed message), nil while a message is incomplete, or an error for a
// frame that breaks the protocol.
func (r *reassembler) add(f *Frame) (*Frame, Message, error) {
	switch f.Kind {
	case FrameChunk:
		return r.chunk(f)
	case FrameAbort:
		if m := r.messages[f.ID]; m != nil {
			delete(r.messages, f.ID)
			pool.Put(m.buf)
		}
		return nil, Message{}, nil
	}
	if len(f.Sizes) == 0 {
		return f, Message{Payload: f.Payload, Buffers: f.Buffers}, nil
	}
	if len(f.Sizes) > maxBuffersPerMessage {
		return nil, Message{}, fmt.Errorf("message %d announces %d buffers, more than %d", f.ID, len(f.Sizes), maxBuffersPerMessage)
	}
	var total int64
	for _, n := range f.Sizes {
		if n < 0 {
			return nil, Message{}, fmt.Errorf("message %d announces a negative size", f.ID)
		}
		total += n
		if total > r.maxSize {
			return nil, Message{}, fmt.Errorf("%w: message %d announces more than the %d-byte limit", ErrTooLarge, f.ID, r.maxSize)
		}
	}
	if _, dup := r.messages[f.ID]; dup {
		return nil, Message{}, fmt.Errorf("message %d announced twice", f.ID)
	}
	r.messages[f.ID] = &inMessage{header: f, buf: pool.Get(int(total))}
	return nil, Message{}, nil
}

// dest is the memory a chunk of message id at offset, n bytes long, belongs in, or nil if no
// message being received has such a place. Stream decoders put chunks there directly.
func (r *reassembler) dest(id uint64, offset int64, n int) []byte {
	m := r.messages[id]
	if m == nil || offset < 0 || offset+int64(n) > int64(len(m.buf)) {
		return nil
	}
	return m.buf[offset : offset+int64(n)]
}

// attach lets s decode chunks straight into the messages being received, if it can.
func (r *reassembler) attach(s Stream) {
	if ss, ok := s.(sinkSetter); ok {
		ss.setChunkSink(r.dest)
	}
}

func (r *reassembler) chunk(f *Frame) (*Frame, Message, error) {
	m := r.messages[f.ID]
	if m == nil {
		return nil, Message{}, fmt.Errorf("chunk of unknown message %d", f.ID)
	}
	end := f.Offset + int64(len(f.Payload))
	if f.Offset < 0 || end > int64(len(m.buf)) {
		return nil, Message{}, fmt.Errorf("chunk of message %d at %d+%d lies outside its %d bytes", f.ID, f.Offset, len(f.Payload), len(m.buf))
	}
	if !f.sunk {
		copy(m.buf[f.Offset:end], f.Payload)
	}
	m.received += int64(len(f.Payload))
	if m.received < int64(len(m.buf)) {
		return nil, Message{}, nil
	}
	delete(r.messages, f.ID)
	buf := m.buf
	msg := Message{release: func() { pool.Put(buf) }}
	at := int64(0)
	for i, n := range m.header.Sizes {
		seg := buf[at : at+n : at+n]
		at += n
		if i == 0 {
			msg.Payload = seg
		} else {
			msg.Buffers = append(msg.Buffers, seg)
		}
	}
	m.header.Sizes = nil
	return m.header, msg, nil
}

// close drops incomplete messages.
func (r *reassembler) close() {
	for id, m := range r.messages {
		delete(r.messages, id)
		pool.Put(m.buf)
	}
}

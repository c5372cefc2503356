package pybind

import (
	"fmt"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// Segments is a received message as Python sees it: segment 0 is the payload, the rest are
// its out-of-band buffers.
type Segments struct {
	msg    core.Message
	agent  *Agent
	lendID int64
}

func (s *Segments) segment(i int) []byte {
	if i == 0 {
		return s.msg.Payload
	}
	return s.msg.Buffers[i-1]
}

// NumSegments is the payload plus the number of buffers.
func (s *Segments) NumSegments() int { return 1 + len(s.msg.Buffers) }

// SegmentSize is the length of segment i, or -1 if there is no such segment.
func (s *Segments) SegmentSize(i int) int {
	if i < 0 || i >= s.NumSegments() {
		return -1
	}
	return len(s.segment(i))
}

// CopySegment copies segment i to the Python buffer at addr, which holds SegmentSize(i) bytes.
func (s *Segments) CopySegment(i int, addr uintptr) (err error) {
	defer recovered(&err)
	if i < 0 || i >= s.NumSegments() {
		return fmt.Errorf("no segment %d in a message of %d", i, s.NumSegments())
	}
	src := s.segment(i)
	if len(src) > 0 {
		dst := unsafe.Slice((*byte)(pythonMemory(addr)), len(src))
		readyFresh(dst)
		copy(dst, src)
	}
	return nil
}

// Lend lets Python use the message's memory in place: it returns the address of its one
// buffer, where the segments lie back to back, or 0 if the message is not in one buffer.
// The memory stays valid, and Go leaves it alone, until Python calls Return.
func (s *Segments) Lend() uintptr {
	if !s.msg.Pooled() || s.msg.Size() == 0 {
		return 0
	}
	s.agent.lendMu.Lock()
	defer s.agent.lendMu.Unlock()
	if s.lendID == 0 {
		s.agent.nextLend++
		s.lendID = s.agent.nextLend
		s.agent.lent[s.lendID] = s.msg
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(s.msg.Payload)))
}

// LendID names the lent memory for Agent.Return.
func (s *Segments) LendID() int64 { return s.lendID }

// Release gives the message's memory back for reuse unless it was lent.
func (s *Segments) Release() {
	if s.lendID == 0 {
		s.msg.Release()
	}
}

// Take copies a small message to Python with one call: the int64 table at sizes (room for
// tableLen entries) gets StatusOK then each segment's size, and buf (bufLen bytes) the segments
// back to back; the message is released. It returns the number of segments, or -1, having
// copied and released nothing, for a message lent in place or one that does not fit.
func (s *Segments) Take(sizes uintptr, tableLen int, buf uintptr, bufLen int) int {
	return s.take(StatusOK, sizes, tableLen, buf, bufLen)
}

func (s *Segments) take(status int, sizes uintptr, tableLen int, buf uintptr, bufLen int) (n int) {
	count := s.NumSegments()
	if s.msg.Pooled() || count+1 > tableLen || s.msg.Size() > bufLen || sizes == 0 || buf == 0 {
		return -1
	}
	table := unsafe.Slice((*int64)(pythonMemory(sizes)), count+1)
	dst := unsafe.Slice((*byte)(pythonMemory(buf)), bufLen)
	table[0] = int64(status)
	at := 0
	for i := range count {
		seg := s.segment(i)
		table[i+1] = int64(len(seg))
		at += copy(dst[at:], seg)
	}
	s.Release()
	return count
}

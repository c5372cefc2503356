package shmtransport

import (
	"bytes"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"golang.org/x/sys/unix"
)

// residentPages counts the pages of mem that take memory.
func residentPages(t *testing.T, mem []byte) int {
	t.Helper()
	if len(mem) == 0 {
		return 0
	}
	vec := make([]byte, (len(mem)+pageBytes-1)/pageBytes)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

func TestIdleStreamsGiveTheirPagesBack(t *testing.T) {
	_, _, c, s := livenessPair(t)
	openBulkLane(t, c, s)
	client, server := c.(*stream), s.(*stream)
	rx := &landingReceiver{dst: map[uint64][]byte{}}
	server.SetChunkSink(rx.sink)
	small, area := client.lanes[laneSmall].out.r.data, client.placer.area
	// Wrap the small lane's ring twice, and land a big message.
	payload := bytes.Repeat([]byte{5}, 16<<10)
	for i := range 2 * len(small) / len(payload) {
		if err := client.Send(&wire.Frame{Kind: wire.FrameRequest, ID: uint64(i), Payload: payload}); err != nil {
			t.Fatal(err)
		}
		if f, err := server.Recv(); err != nil || !bytes.Equal(f.Payload, payload) {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	data := randomBytes(t, 1<<20)
	got := sendBig(t, client, server, rx, 1000, data, 256<<10)
	if !got.landed || !bytes.Equal(got.data, data) {
		t.Fatal("the big message did not land whole")
	}
	got.release()
	ringPages, landingPages := residentPages(t, small), residentPages(t, area)
	if ringPages < len(small)/pageBytes-1 || landingPages < len(data)/pageBytes {
		t.Fatalf("before: %d ring pages and %d landing pages take memory; want the ring's and the message's", ringPages, landingPages)
	}
	deadline := time.Now().Add(10 * idleTicksBeforeGivingBack * testPeerTimeout / beatsPerTimeout)
	for time.Now().Before(deadline) && (residentPages(t, small) > 1 || residentPages(t, area) > 0) {
		time.Sleep(testPeerTimeout / beatsPerTimeout)
	}
	if ringPages, landingPages = residentPages(t, small), residentPages(t, area); ringPages > 1 || landingPages > 0 {
		t.Fatalf("idle: %d ring pages and %d landing pages still take memory", ringPages, landingPages)
	}
	// And the stream goes on as before: frames, and a big message landed again.
	exchange(t, client, server)
	data = randomBytes(t, 1<<20)
	if got := sendBig(t, client, server, rx, 1001, data, 256<<10); !got.landed || !bytes.Equal(got.data, data) {
		t.Fatal("after giving its pages back, the stream lost a big message's bytes")
	} else {
		got.release()
	}
}

func TestALandingTheConsumerHoldsIsNotGivenBack(t *testing.T) {
	_, _, c, s := livenessPair(t)
	openBulkLane(t, c, s)
	client, server := c.(*stream), s.(*stream)
	rx := &landingReceiver{dst: map[uint64][]byte{}}
	server.SetChunkSink(rx.sink)
	data := randomBytes(t, 1<<20)
	held := sendBig(t, client, server, rx, 1, data, 256<<10)
	other := sendBig(t, client, server, rx, 2, randomBytes(t, 1<<20), 256<<10)
	other.release() // the later landing goes back; the first stays held
	time.Sleep(4 * idleTicksBeforeGivingBack * testPeerTimeout / beatsPerTimeout)
	if !held.landed || !bytes.Equal(held.data, data) {
		t.Fatal("a landing the consumer holds changed while its stream was idle")
	}
	if n := residentPages(t, client.placer.area); n != len(data)/pageBytes {
		t.Fatalf("%d landing pages take memory; want only the held landing's %d", n, len(data)/pageBytes)
	}
	held.release()
}

package shmtransport

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

const testPeerTimeout = 400 * time.Millisecond

// livenessPair opens a stream between two transports with a short peer timeout.
func livenessPair(t *testing.T) (dialer, listener *Transport, client, server transport.Stream) {
	t.Helper()
	var err error
	if listener, err = New("tok", MinRingBytes); err != nil {
		t.Fatal(err)
	}
	if dialer, err = New("tok", MinRingBytes); err != nil {
		t.Fatal(err)
	}
	listener.SetPeerTimeout(testPeerTimeout)
	dialer.SetPeerTimeout(testPeerTimeout)
	if client, server, err = connect(t, dialer, listener); err != nil {
		t.Fatal(err)
	}
	return dialer, listener, client, server
}

func TestAFrozenPeerEndsItsStreamsAfterThePeerTimeout(t *testing.T) {
	_, listener, client, _ := livenessPair(t)
	// A producer waiting for ring space the frozen peer will never free, and a reader waiting
	// for a frame it will never send.
	sendErr := make(chan error, 1)
	go func() {
		big := bytes.Repeat([]byte{7}, MinRingBytes)
		for i := range 8 {
			if err := client.Send(&wire.Frame{Kind: wire.FrameRequest, ID: uint64(i), Payload: big}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	recvErr := make(chan error, 1)
	go func() {
		_, err := client.Recv()
		recvErr <- err
	}()
	frozenAt := time.Now()
	listener.frozen.Store(true)
	for name, ch := range map[string]chan error{"the blocked Send": sendErr, "the waiting Recv": recvErr} {
		select {
		case err := <-ch:
			took := time.Since(frozenAt)
			if err == nil || !strings.Contains(err.Error(), "stopped answering") || !strings.Contains(err.Error(), "the worker at shm://") {
				t.Errorf("%s: got %v, want the peer named as having stopped answering", name, err)
			}
			if took < testPeerTimeout {
				t.Errorf("%s failed after %v, before the peer timeout %v", name, took, testPeerTimeout)
			}
		case <-time.After(testPeerTimeout + 5*time.Second):
			t.Fatalf("%s still waits %v after its peer froze", name, testPeerTimeout+5*time.Second)
		}
	}
}

func TestAnIdlePeerThatRunsKeepsItsStream(t *testing.T) {
	_, _, client, server := livenessPair(t)
	time.Sleep(4 * testPeerTimeout) // no frames, only heartbeats
	exchange(t, client, server)
}

func TestPeersFrozenTogetherKeepTheirStreamWhenTheyRunAgain(t *testing.T) {
	// A whole job stopped (Ctrl-Z on its launcher) and resumed: the dialer stops just after
	// it saw the listener's last beat, and runs a moment before the listener does. Neither
	// beat meanwhile, and neither may take the other for frozen when both run again.
	dialer, listener, client, server := livenessPair(t)
	time.Sleep(testPeerTimeout) // beating
	listener.frozen.Store(true)
	time.Sleep(testPeerTimeout / 8)
	dialer.frozen.Store(true)
	time.Sleep(4 * testPeerTimeout)
	dialer.frozen.Store(false)
	time.Sleep(testPeerTimeout / 4)
	listener.frozen.Store(false)
	time.Sleep(2 * testPeerTimeout)
	exchange(t, client, server)
}

// exchange sends a frame each way and fails the test unless both arrive.
func exchange(t *testing.T, a, b transport.Stream) {
	t.Helper()
	for _, dir := range [][2]transport.Stream{{a, b}, {b, a}} {
		if err := dir[0].Send(&wire.Frame{Kind: wire.FrameRequest, ID: 9, Payload: []byte("still here")}); err != nil {
			t.Fatalf("send: %v", err)
		}
		f, err := dir[1].Recv()
		if err != nil || string(f.Payload) != "still here" {
			t.Fatalf("recv: %v, %v", f, err)
		}
	}
}

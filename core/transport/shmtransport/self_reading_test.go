package shmtransport

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestEveryFrameGoesToOneReader has a thread reading for itself (RecvWaiting) beside the
// reader goroutine (Recv) while small and big frames flow: each frame reaches exactly one of
// them, whole, and each reader sees the small lane in order.
func TestEveryFrameGoesToOneReader(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	const small, big = 3000, 20
	bigPayload := bytes.Repeat([]byte{7}, 3*MinRingBytes) // streams through the bulk ring
	go func() {
		for i := range small {
			client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: uint64(i), Payload: []byte("reply")})
			if i%(small/big) == 0 {
				client.Send(&wire.Frame{Kind: wire.FrameChunk, ID: uint64(i), Payload: bigPayload})
			}
		}
	}()

	var mu sync.Mutex
	seen := map[uint64]int{}
	chunks := 0
	take := func(reader string, f *wire.Frame, last *int64) {
		mu.Lock()
		defer mu.Unlock()
		if f.Kind == wire.FrameChunk {
			if reader != "Recv" || !bytes.Equal(f.Payload, bigPayload) {
				t.Errorf("%s got a chunk of %d bytes; want them whole and only through Recv", reader, len(f.Payload))
			}
			chunks++
			return
		}
		if int64(f.ID) <= *last {
			t.Errorf("%s read small frame %d after %d", reader, f.ID, *last)
		}
		*last = int64(f.ID)
		seen[f.ID]++
	}
	all := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == small && chunks == big
	}

	go func() {
		last := int64(-1)
		for {
			f, err := server.Recv()
			if err != nil {
				return
			}
			take("Recv", f, &last)
		}
	}()
	runtime.LockOSThread() // as a Python thread waiting in Go
	defer runtime.UnlockOSThread()
	last := int64(-1)
	selfRead := 0
	for deadline := time.Now().Add(20 * time.Second); !all() && time.Now().Before(deadline); {
		f, err := server.(transport.SelfReading).RecvWaiting(20*time.Millisecond, func() bool { return false })
		switch {
		case errors.Is(err, transport.ErrBusy):
			runtime.Gosched()
		case err != nil:
			t.Fatal(err)
		case f != nil:
			selfRead++
			take("RecvWaiting", f, &last)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != small || chunks != big {
		t.Fatalf("got %d of %d small frames and %d of %d chunks", len(seen), small, chunks, big)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("small frame %d was read %d times", id, n)
		}
	}
	if selfRead == 0 {
		t.Fatal("the waiting thread read no frame itself")
	}
	t.Logf("the waiting thread read %d of %d small frames", selfRead, small)
}

// TestRecvWaitingWakes covers what ends a self-reading thread's wait.
func TestRecvWaitingWakes(t *testing.T) {
	for _, c := range []struct {
		name string
		// act runs while the thread waits; it may set stop.
		act       func(client, server transport.Stream, stop func())
		wantFrame bool
		wantErr   error // nil: no error
		atLeast   time.Duration
	}{
		{"a small frame comes", func(client, _ transport.Stream, _ func()) {
			client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 1})
		}, true, nil, 0},
		{"two frames at once: the one left goes to Recv", func(client, _ transport.Stream, _ func()) {
			client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 1})
			client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 2})
		}, true, nil, 0},
		{"a big message's frame in the small lane", func(client, _ transport.Stream, _ func()) {
			l := &client.(*stream).lanes[laneSmall]
			pieces, total, _ := l.parts.Encode(&wire.Frame{Kind: wire.FrameChunk, ID: 3, Payload: []byte("x")})
			l.out.write(pieces, total)
		}, false, transport.ErrMalformed, 0},
		{"Interrupt, with stop set", func(_, server transport.Stream, stop func()) {
			stop()
			server.(transport.SelfReading).Interrupt()
		}, false, nil, 0},
		{"the wait runs out", func(_, _ transport.Stream, _ func()) {}, false, nil, 300 * time.Millisecond},
		{"the peer closes", func(client, _ transport.Stream, _ func()) { client.Close() }, false, errAny, 0},
		{"the stream is closed here", func(_, server transport.Stream, _ func()) { server.Close() }, false, errAny, 0},
		{"a small frame too big for the ring is left to Recv", func(client, _ transport.Stream, _ func()) {
			go client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 2, Payload: make([]byte, 2*MinRingBytes)})
		}, false, transport.ErrBusy, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, server, err := pair(t, "tok", "tok", MinRingBytes)
			if err != nil {
				t.Fatal(err)
			}
			// The reader goroutine sleeps on the socket meanwhile, as in a worker.
			received := make(chan *wire.Frame, 1)
			go func() {
				if f, err := server.Recv(); err == nil {
					received <- f
				}
			}()
			var mu sync.Mutex
			stopped := false
			stop := func() { mu.Lock(); stopped = true; mu.Unlock() }
			go func() {
				time.Sleep(50 * time.Millisecond) // the thread is asleep by now
				c.act(client, server, stop)
			}()
			wait := 300 * time.Millisecond
			if c.atLeast == 0 {
				wait = 10 * time.Second
			}
			start := time.Now()
			f, err := server.(transport.SelfReading).RecvWaiting(wait, func() bool { mu.Lock(); defer mu.Unlock(); return stopped })
			took := time.Since(start)
			switch {
			case c.wantErr == errAny && err == nil, c.wantErr != errAny && !errors.Is(err, c.wantErr):
				t.Fatalf("err = %v, want %v", err, c.wantErr)
			case (f != nil) != c.wantFrame:
				t.Fatalf("frame = %v, want one: %v", f, c.wantFrame)
			case took < c.atLeast:
				t.Fatalf("returned after %v, before its %v", took, c.atLeast)
			case c.atLeast == 0 && took > 5*time.Second:
				t.Fatalf("returned only after %v", took)
			}
			if errors.Is(c.wantErr, transport.ErrBusy) || strings.HasPrefix(c.name, "two frames") {
				// The frame the thread did not read was written after the thread was woken
				// for the other, or was too big for it: the reader goroutine must hear of it.
				select {
				case f := <-received:
					if f.ID != 2 {
						t.Fatalf("Recv got frame %d, want 2", f.ID)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the reader goroutine was not woken for the frame left to it")
				}
			}
		})
	}
}

// errAny stands for any error in a table.
var errAny = errors.New("any error")

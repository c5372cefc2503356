package shmtransport

import (
	"bytes"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// TestEveryFrameGoesToOneReader has a thread reading for itself (RecvWaiting) beside the
// reader goroutine (Recv) while small and big frames flow: each frame reaches exactly one of
// them, whole, and the small lane's frames are handled in order whichever reader read them.
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
			if i%100 == 0 {
				// Pauses in which both readers go to sleep: the thread, at the doorbell, is
				// then woken for the next small frame.
				time.Sleep(time.Millisecond)
			}
		}
	}()

	var mu sync.Mutex
	seen := map[uint64]int{}
	chunks := 0
	last := int64(-1) // the small frame handled last, by either reader
	take := func(reader string, f *wire.Frame) {
		mu.Lock()
		defer mu.Unlock()
		if f.Kind == wire.FrameChunk {
			if reader != "Recv" || !bytes.Equal(f.Payload, bigPayload) {
				t.Errorf("%s got a chunk of %d bytes; want them whole and only through Recv", reader, len(f.Payload))
			}
			chunks++
			return
		}
		if int64(f.ID) <= last {
			t.Errorf("%s handled small frame %d after %d", reader, f.ID, last)
		}
		last = int64(f.ID)
		seen[f.ID]++
	}
	all := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == small && chunks == big
	}

	go func() {
		for {
			f, err := server.Recv()
			if err != nil {
				return
			}
			take("Recv", f)
		}
	}()
	runtime.LockOSThread() // as a Python thread waiting in Go
	defer runtime.UnlockOSThread()
	selfRead := 0
	for deadline := time.Now().Add(20 * time.Second); !all() && time.Now().Before(deadline); {
		handled, err := server.(transport.SelfReading).RecvWaiting(20*time.Millisecond, func() bool { return false }, func(f *wire.Frame) {
			selfRead++
			take("RecvWaiting", f)
		})
		switch {
		case errors.Is(err, transport.ErrBusy):
			runtime.Gosched()
		case err != nil:
			t.Fatal(err)
		case handled && selfRead == 0:
			t.Fatal("RecvWaiting reported a frame it did not hand over")
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

// TestRecvWaitingWakes covers what ends a self-reading thread's wait, and that the reader
// goroutine hears of the frames the thread leaves.
func TestRecvWaitingWakes(t *testing.T) {
	small := func(id uint64) *wire.Frame { return &wire.Frame{Kind: wire.FrameResponse, ID: id} }
	for _, c := range []struct {
		name string
		// act runs while the thread waits; it may set stop.
		act       func(client, server transport.Stream, stop func())
		wantFrame bool
		wantErr   error // nil: no error
		atLeast   time.Duration
		// after, if set, sends frames once RecvWaiting returned; recvID is the frame the reader
		// goroutine must then get (0: none is checked).
		after  func(client transport.Stream)
		recvID uint64
	}{
		{name: "a small frame comes", act: func(client, _ transport.Stream, _ func()) {
			client.Send(small(1))
		}, wantFrame: true},
		{name: "two frames at once: the one left goes to Recv", act: func(client, _ transport.Stream, _ func()) {
			client.Send(small(1))
			client.Send(small(2))
		}, wantFrame: true, recvID: 2},
		{name: "Interrupt, with stop set; the next frame goes to Recv", act: func(_, server transport.Stream, stop func()) {
			stop()
			server.(transport.SelfReading).Interrupt()
		}, after: func(client transport.Stream) { client.Send(small(5)) }, recvID: 5},
		{name: "the wait runs out; the next frame goes to Recv", act: func(_, _ transport.Stream, _ func()) {},
			atLeast: 300 * time.Millisecond, after: func(client transport.Stream) { client.Send(small(5)) }, recvID: 5},
		{name: "the peer closes", act: func(client, _ transport.Stream, _ func()) { client.Close() }, wantErr: errAny},
		{name: "the stream is closed here", act: func(_, server transport.Stream, _ func()) { server.Close() }, wantErr: errAny},
		{name: "a small frame too big for the ring is left to Recv", act: func(client, _ transport.Stream, _ func()) {
			go client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 2, Payload: make([]byte, 2*MinRingBytes)})
		}, wantErr: transport.ErrBusy, recvID: 2},
		{name: "a big message's frame in the small lane", act: func(client, _ transport.Stream, _ func()) {
			l := &client.(*stream).lanes[laneSmall]
			pieces, total, _ := l.parts.Encode(&wire.Frame{Kind: wire.FrameChunk, ID: 3, Payload: []byte("x")})
			l.out.write(pieces, total)
		}, wantErr: transport.ErrMalformed},
		{name: "a frame that lends memory in the small lane", act: func(client, _ transport.Stream, _ func()) {
			out := &client.(*stream).lanes[laneSmall].out
			var prefix [lengthBytes]byte
			putUint32(prefix[:], 8|lendsFlag)
			out.put(prefix[:])
			out.put(make([]byte, 8))
			out.publish()
		}, wantErr: transport.ErrMalformed},
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
			srv := server.(*stream)
			for deadline := time.Now().Add(5 * time.Second); srv.lanes[laneSmall].in.r.ctrl.readerAsleep.Load() != readerOnSocket; {
				if time.Now().After(deadline) {
					t.Fatal("the reader goroutine never went to sleep")
				}
				time.Sleep(time.Millisecond)
			}
			srv.readMu.Lock() // it lets go of the rings before it sleeps
			srv.readMu.Unlock()
			var mu sync.Mutex
			stopped := false
			stop := func() { mu.Lock(); stopped = true; mu.Unlock() }
			go func() {
				time.Sleep(50 * time.Millisecond) // the thread is most likely asleep by now
				c.act(client, server, stop)
			}()
			wait := 300 * time.Millisecond
			if c.atLeast == 0 {
				wait = 10 * time.Second
			}
			start := time.Now()
			var f *wire.Frame
			handled, err := server.(transport.SelfReading).RecvWaiting(wait, func() bool { mu.Lock(); defer mu.Unlock(); return stopped }, func(got *wire.Frame) { f = got })
			took := time.Since(start)
			switch {
			case c.wantErr == errAny && err == nil, c.wantErr != errAny && !errors.Is(err, c.wantErr):
				t.Fatalf("err = %v, want %v", err, c.wantErr)
			case handled != c.wantFrame || (f != nil) != c.wantFrame:
				t.Fatalf("handled %v, frame = %v; want one: %v", handled, f, c.wantFrame)
			case took < c.atLeast:
				t.Fatalf("returned after %v, before its %v", took, c.atLeast)
			case c.atLeast == 0 && took > 5*time.Second:
				t.Fatalf("returned only after %v", took)
			}
			if c.after != nil {
				c.after(client)
			}
			if c.recvID != 0 {
				// The frame the thread did not read came after it stopped asking for wake-ups,
				// or woke only it, or was too big for it: the reader goroutine must hear of it.
				select {
				case f := <-received:
					if f.ID != c.recvID {
						t.Fatalf("Recv got frame %d, want %d", f.ID, c.recvID)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the reader goroutine was not woken for the frame left to it")
				}
			}
		})
	}
}

// TestAThreadReadsOnlyWhatItFoundWhole: a peer that rewrites a frame's length after the
// waiting thread found the frame whole (to make it wait for more, or read lent memory) has
// broken the protocol; the thread does not wait.
func TestAThreadReadsOnlyWhatItFoundWhole(t *testing.T) {
	for _, c := range []struct {
		name   string
		prefix func(n uint32) uint32
	}{
		{"the length grows", func(n uint32) uint32 { return n + 1000 }},
		{"the frame now lends memory", func(n uint32) uint32 { return n | lendsFlag }},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, server, err := pair(t, "tok", "tok", MinRingBytes)
			if err != nil {
				t.Fatal(err)
			}
			if err := client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 1, Payload: []byte("reply")}); err != nil {
				t.Fatal(err)
			}
			srv := server.(*stream)
			l := &srv.lanes[laneSmall]
			srv.readMu.Lock()
			defer srv.readMu.Unlock()
			n, known, err := l.in.peek()
			if err != nil || !known || l.in.head-l.in.tail < lengthBytes+n {
				t.Fatalf("peek: %d bytes, known %v, %v; want the frame whole", n, known, err)
			}
			at := l.in.tail & (l.in.r.size - 1)
			putUint32(l.in.r.data[at:], c.prefix(uint32(n))) // the peer rewrites it now
			done := make(chan error, 1)
			go func() {
				_, err := srv.readWhole(l)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, transport.ErrMalformed) {
					t.Fatalf("err = %v, want transport.ErrMalformed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the thread waited for the rest of a frame it had found whole")
			}
		})
	}
}

// errAny stands for any error in a table.
var errAny = errors.New("any error")

// TestAThreadReadsSmallFramesWhileRecvReadsABigOne: while the reader goroutine is inside a
// bulk frame (one that streams through the ring, whose writer stalled; or a lent chunk being
// copied), a thread reading for itself still takes the small lane's frames, and the big frame
// arrives whole once its writer goes on.
func TestAThreadReadsSmallFramesWhileRecvReadsABigOne(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	received := receiving(server, 8)
	client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 1}) // the bulk lane opens after it
	<-received
	type outcome struct {
		handled []uint64
		err     error
	}
	result := make(chan outcome, 1)
	go func() {
		runtime.LockOSThread()
		var handled []uint64
		var err error
		// Until the reader goroutine is back in Recv, having handed frame 1 over, the stream is
		// busy (ErrBusy): the thread asks again. With the bug this tests, Recv holds the rings'
		// lock while it reads the big frame, and the thread is told it is busy until it gives up.
		for start := time.Now(); ; time.Sleep(time.Millisecond) {
			_, err = server.(transport.SelfReading).RecvWaiting(10*time.Second, func() bool { return false }, func(f *wire.Frame) { handled = append(handled, f.ID) })
			if !errors.Is(err, transport.ErrBusy) || time.Since(start) > 2*time.Second {
				break
			}
		}
		result <- outcome{handled, err}
	}()
	time.Sleep(50 * time.Millisecond) // the thread is most likely asleep by now
	// Part of a frame bigger than the bulk ring, then nothing: the goroutine waits for the rest.
	lane := &client.(*stream).lanes[laneBulk]
	payload := make([]byte, 3*MinRingBytes)
	pieces, total, err := lane.parts.Encode(&wire.Frame{Kind: wire.FrameChunk, ID: 7, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	encoded := bytes.Join(pieces, nil)
	var prefix [lengthBytes]byte
	putUint32(prefix[:], uint32(total))
	lane.out.put(prefix[:])
	lane.out.put(encoded[:1000])
	lane.out.publish()
	time.Sleep(50 * time.Millisecond)
	client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 2}) // rings the thread's doorbell
	select {
	case o := <-result:
		if o.err != nil || !slices.Equal(o.handled, []uint64{2}) {
			t.Fatalf("the thread handled %v (err %v), want frame 2", o.handled, o.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the thread waited for the reader goroutine's frame")
	}
	// The rest of the big frame, written as the ring makes room.
	go func() {
		for rest := encoded[1000:]; len(rest) > 0; {
			n := min(len(rest), MinRingBytes/2)
			lane.out.put(rest[:n])
			lane.out.publish()
			rest = rest[n:]
		}
	}()
	select {
	case f := <-received:
		if f.ID != 7 || len(f.Payload) != len(payload) {
			t.Fatalf("the reader goroutine got frame %d of %d bytes, want the big frame 7", f.ID, len(f.Payload))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the big frame did not arrive")
	}
}

// TestAThreadWaitsForTheFrameRecvReturned: while Recv's reader holds a frame it has not
// handled (it has not called Recv again), a thread does not read the next one, which would be
// handled first; Recv gets it.
func TestAThreadWaitsForTheFrameRecvReturned(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	client.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1})
	first, err := server.Recv() // held, not yet handled
	if err != nil || first.ID != 1 {
		t.Fatalf("Recv: %v, %v", first, err)
	}
	client.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 2})
	handled, err := server.(transport.SelfReading).RecvWaiting(time.Second, func() bool { return false }, func(f *wire.Frame) {
		t.Errorf("the thread handled frame %d before Recv's reader handled frame 1", f.ID)
	})
	if handled || !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("RecvWaiting: handled %v, err %v; want transport.ErrBusy", handled, err)
	}
	next, err := server.Recv()
	if err != nil || next.ID != 2 {
		t.Fatalf("Recv after: %v, %v; want frame 2", next, err)
	}
}

// TestAThreadReadsPastABigFrameRecvHolds: a big message's frame that Recv's reader holds (it
// may wait for memory before it calls Recv again) does not stop a thread from reading the
// small lane: the lanes are not ordered with each other, and a small reply must not wait for
// a big message's memory.
func TestAThreadReadsPastABigFrameRecvHolds(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	// A small frame first: Recv reads the bulk lane only after the stream's first frame.
	client.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 0})
	if f, err := server.Recv(); err != nil || f.ID != 0 {
		t.Fatalf("Recv: %v, %v", f, err)
	}
	client.Send(&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: make([]byte, 1000)})
	held, err := server.Recv()
	if err != nil || held.Kind != wire.FrameChunk {
		t.Fatalf("Recv: %v, %v", held, err)
	}
	client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 2})
	var got *wire.Frame
	handled, err := server.(transport.SelfReading).RecvWaiting(5*time.Second, func() bool { return false }, func(f *wire.Frame) { got = f })
	if err != nil || !handled || got == nil || got.ID != 2 {
		t.Fatalf("RecvWaiting: handled %v, frame %v, err %v; want frame 2", handled, got, err)
	}
}

// TestASpinningThreadCostsTheProducerNoWakeUp: a thread that has just begun to wait polls the
// small lane for a while before it sleeps at the doorbell, so a frame sent meanwhile reaches it
// without the producer ringing anything.
func TestASpinningThreadCostsTheProducerNoWakeUp(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	server.(*stream).threadPoll = 5 * time.Second
	bell := &server.(*stream).lanes[laneSmall].in.r.ctrl.doorbell
	rungBefore := bell.Load()
	got := make(chan *wire.Frame, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, err := server.(transport.SelfReading).RecvWaiting(10*time.Second, func() bool { return false }, func(f *wire.Frame) { got <- f })
		if err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(50 * time.Millisecond) // the thread is polling by now (were it not, it would read the frame at once)
	if err := client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 9, Payload: []byte("reply")}); err != nil {
		t.Fatal(err)
	}
	expectFrame(t, got, 9, "the polling thread")
	if rung := bell.Load() - rungBefore; rung != 0 {
		t.Fatalf("the producer rang the doorbell %d times for a thread that was polling", rung)
	}
}

// TestFramesThatCameWhileAThreadPolledReachRecv: frames written while a thread polled woke no
// one; those it leaves in the ring (it reads one) wake the reader goroutine.
func TestFramesThatCameWhileAThreadPolledReachRecv(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	server.(*stream).threadPoll = 5 * time.Second
	server.(*stream).readerPoll = 0 // it sleeps on the socket: only a kick wakes it
	received := receiving(server, 4)
	time.Sleep(50 * time.Millisecond) // the reader goroutine sleeps on the socket
	polling, sent := make(chan struct{}), make(chan struct{})
	calls := 0
	stop := func() bool {
		calls++
		if calls == 2 { // the first look while polling: both frames come now
			close(polling)
			<-sent
		}
		return false
	}
	handled := make(chan uint64, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if _, err := server.(transport.SelfReading).RecvWaiting(10*time.Second, stop, func(f *wire.Frame) { handled <- f.ID }); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-polling:
	case <-time.After(3 * time.Second):
		t.Fatal("the thread did not poll")
	}
	for id := uint64(1); id <= 2; id++ {
		if err := client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: id, Payload: []byte("reply")}); err != nil {
			t.Fatal(err)
		}
	}
	close(sent)
	if id := <-handled; id != 1 {
		t.Fatalf("the thread handled frame %d, want 1", id)
	}
	expectFrame(t, received, 2, "Recv, after the thread left it in the ring,")
}

// TestAPollingReaderAsksForNoWakeUp: the reader goroutine with nothing to read polls the rings
// before it asks for a wake-up byte, so a frame that comes meanwhile costs the producer none.
func TestAPollingReaderAsksForNoWakeUp(t *testing.T) {
	client, server, err := pair(t, "tok", "tok", MinRingBytes)
	if err != nil {
		t.Fatal(err)
	}
	server.(*stream).readerPoll = 5 * time.Second
	received := make(chan *wire.Frame, 1)
	go func() {
		f, err := server.Recv()
		if err != nil {
			t.Error(err)
			return
		}
		received <- f
	}()
	ctrl := server.(*stream).lanes[laneSmall].in.r.ctrl
	for deadline := time.Now().Add(100 * time.Millisecond); time.Now().Before(deadline); {
		if how := ctrl.readerAsleep.Load(); how != 0 {
			t.Fatalf("the reader asked for a wake-up (%d) while it should poll", how)
		}
		time.Sleep(time.Millisecond)
	}
	if err := client.Send(&wire.Frame{Kind: wire.FrameResponse, ID: 4, Payload: []byte("reply")}); err != nil {
		t.Fatal(err)
	}
	expectFrame(t, received, 4, "the polling reader")
}

// expectFrame fails the test unless frame id comes on frames within 3 s; who names the reader.
func expectFrame(t *testing.T, frames <-chan *wire.Frame, id uint64, who string) {
	t.Helper()
	select {
	case f := <-frames:
		if f.ID != id {
			t.Fatalf("%s got frame %d, want %d", who, f.ID, id)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("%s did not get frame %d within 3 s", who, id)
	}
}

// receiving calls s.Recv until it fails, sending each frame on the channel it returns (of
// capacity n).
func receiving(s transport.Stream, n int) <-chan *wire.Frame {
	frames := make(chan *wire.Frame, n)
	go func() {
		for {
			f, err := s.Recv()
			if err != nil {
				return
			}
			frames <- f
		}
	}()
	return frames
}

package rendezvous

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// admitted is the number of requests s has taken into a round so far.
func admitted(s *MemStore) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admitted
}

// eventually waits up to 10 s for cond, and fails the test naming what if it does not hold.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
	}
}

// cuttingProxy forwards TCP connections to a server and can break every one it carries, as a
// network blip or a keepalive lost on a loaded host would.
type cuttingProxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCuttingProxy(t *testing.T, target string) *cuttingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{l: l}
	t.Cleanup(func() { l.Close(); p.cut() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

// cut breaks every connection the proxy carries now; new ones still go through.
func (p *cuttingProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestJoinSurvivesABrokenConnection: a worker whose connection to the store breaks while it
// waits for the others joins again, as the same participant, and the world forms; before, its
// join failed, and joining again failed the round for everyone ("taken by both").
func TestJoinSurvivesABrokenConnection(t *testing.T) {
	ctx := storeTestContext(t)
	mem := NewMemStore(2)
	var proxy *cuttingProxy
	remote := servedStore(t, mem, func(addr string) string {
		proxy = newCuttingProxy(t, addr)
		return proxy.l.Addr().String()
	})
	join := func(rank int) GatherRequest {
		return GatherRequest{Round: JoinRound, Rank: rank, Size: 2, Who: fmt.Sprintf(`"w%d"`, rank), Value: []byte{byte(rank)}, WaitMs: 10_000}
	}
	values := make([][][]byte, 2)
	errs := make([]error, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		values[1], errs[1] = remote.Gather(ctx, join(1))
	}()
	eventually(t, "rank 1 reached the store", func() bool { return admitted(mem) == 1 })
	proxy.cut()
	// Rank 1 notices and joins again: its new request reaches the store (or its join ended,
	// and checkWorld says how).
	eventually(t, "rank 1 joins again", func() bool {
		select {
		case <-done:
			return true
		default:
			return admitted(mem) >= 2
		}
	})
	values[0], errs[0] = mem.Gather(ctx, join(0))
	<-done
	checkWorld(t, values, errs)
}

// TestMemStoreAdmitsTheSameParticipantAgain: a participant entering again with what it brought
// the first time waits with its round, or gets the values of a project round that completed
// (its reply was lost); anyone else on that rank is a duplicate.
func TestMemStoreAdmitsTheSameParticipantAgain(t *testing.T) {
	ctx := storeTestContext(t)
	tests := []struct {
		name     string
		again    GatherRequest
		complete bool // enter again after the round completed
		want     string
	}{
		{name: "same participant, round under way", again: GatherRequest{Who: `"w1"`, Value: []byte{1}}},
		{name: "same participant, round completed", again: GatherRequest{Who: `"w1"`, Value: []byte{1}}, complete: true},
		{name: "same name, another record", again: GatherRequest{Who: `"w1"`, Value: []byte{9}}, want: `rank 1 was taken by both "w1" and "w1"`},
		{name: "another name", again: GatherRequest{Who: `"x"`, Value: []byte{1}}, want: `rank 1 was taken by both "w1" and "x"`},
		{name: "another name after completion", again: GatherRequest{Who: `"x"`, Value: []byte{1}}, complete: true, want: "already over"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := NewMemStore(2)
			first := GatherRequest{Round: JoinRound, Rank: 1, Size: 2, Who: `"w1"`, Value: []byte{1}, WaitMs: 10_000}
			again := first
			again.Who, again.Value = tt.again.Who, tt.again.Value
			zero := GatherRequest{Round: JoinRound, Rank: 0, Size: 2, Who: `"w0"`, Value: []byte{0}, WaitMs: 10_000}
			if _, err := store.enter(first); err != nil {
				t.Fatal(err)
			}
			var got [][]byte
			var err error
			if tt.complete {
				if _, err := store.Gather(ctx, zero); err != nil {
					t.Fatal(err)
				}
				got, err = store.Gather(ctx, again)
			} else {
				result := make(chan error, 1)
				go func() {
					var err error
					got, err = store.Gather(ctx, again)
					result <- err
				}()
				// again has entered: it waits with its round, or was refused.
				eventually(t, "the participant entering again is in or out", func() bool { return len(result) > 0 || admitted(store) == 2 })
				if _, err := store.Gather(ctx, zero); err != nil && tt.want == "" {
					t.Fatal(err)
				}
				err = <-result
			}
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want it to say %q", err, tt.want)
				}
				return
			}
			if err != nil || len(got) != 2 || got[0][0] != 0 || got[1][0] != 1 {
				t.Fatalf("got %v, %v; want both records", got, err)
			}
		})
	}
}

package shmtransport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// The tests of another local user re-run this test binary as user nobody (uid 65534), in the
// mode the environment variable names (see TestMain): it needs root, which CI has.
const otherUserMode = "TENSORPLAY_SHM_OTHER_USER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(otherUserMode); mode != "" {
		os.Exit(runAsOtherUser(mode, os.Args[len(os.Args)-2:]))
	}
	os.Exit(m.Run())
}

// runAsOtherUser is the other user's side: "flood NAME N" connects N times to the abstract
// socket NAME and holds the connections until its standard input closes; "squat NAME" binds
// NAME and accepts until then. It prints "ready" once it has.
func runAsOtherUser(mode string, args []string) int {
	name, count := args[0], args[1]
	var held []io.Closer
	switch mode {
	case "flood":
		n, _ := strconv.Atoi(count)
		for range n {
			c, err := net.Dial("unix", "@"+name)
			if err != nil {
				fmt.Println("dial:", err)
				return 1
			}
			held = append(held, c)
		}
	case "squat":
		lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
		if err != nil {
			fmt.Println("listen:", err)
			return 1
		}
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
		held = append(held, lis)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the test closes it
	for _, c := range held {
		c.Close()
	}
	return 0
}

// asOtherUser starts this test binary as user nobody in mode with args, and returns once it
// says it is ready; it is ended by its PID when the test ends.
func asOtherUser(t *testing.T, mode string, args ...string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as another user (CI runs as root)")
	}
	// The test binary sits in a directory only this user can read: nobody runs a copy.
	dir, err := os.MkdirTemp("", "shm-other-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), otherUserMode+"="+mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill() // by its PID
			<-done
		}
	})
	ready := make(chan string, 1)
	go func() {
		buf := make([]byte, 256)
		n, _ := out.Read(buf)
		ready <- string(buf[:n])
	}()
	select {
	case line := <-ready:
		if line != "ready\n" {
			t.Fatalf("the other user's process: %q", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the other user's process never got ready")
	}
}

// socketName is the abstract socket name of a transport's address.
func socketName(t *testing.T, addr string) string {
	t.Helper()
	_, name, ok := splitAddr(addr)
	if !ok {
		t.Fatalf("%q is no shared-memory address", addr)
	}
	return name
}

func listening(t *testing.T) (*Transport, string, chan transport.Stream) {
	t.Helper()
	lt, err := New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lt.Close() })
	accepted := make(chan transport.Stream, 8)
	addr, err := lt.Listen("", func(s transport.Stream) {
		accepted <- s
		<-s.(*stream).done
	})
	if err != nil {
		t.Fatal(err)
	}
	return lt, addr, accepted
}

func dialWithin(t *testing.T, addr string, d time.Duration) error {
	t.Helper()
	dt, err := New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	s, err := dt.Dial(ctx, addr)
	if err == nil {
		s.Close()
	}
	return err
}

// failingAcceptor fails its first accepts as a process out of file descriptors does.
type failingAcceptor struct {
	*net.UnixListener
	mu       sync.Mutex
	failures int
}

func (f *failingAcceptor) AcceptUnix() (*net.UnixConn, error) {
	f.mu.Lock()
	fail := f.failures > 0
	f.failures--
	f.mu.Unlock()
	if fail {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return f.UnixListener.AcceptUnix()
}

func TestTheListenerOutlivesFailedAccepts(t *testing.T) {
	for _, failures := range []int{1, 5} {
		t.Run(strconv.Itoa(failures), func(t *testing.T) {
			lt, err := New("", 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lt.Close() })
			name := fmt.Sprintf("tensorplay-rpc/%d/accept-test-%d", os.Getpid(), failures)
			lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lis.Close() })
			served := make(chan struct{}, 1)
			go lt.accept(&failingAcceptor{UnixListener: lis, failures: failures}, func(s transport.Stream) {
				served <- struct{}{}
				s.Close()
			})
			if err := dialWithin(t, addrPrefix+lt.hostKey+"/"+name, 5*time.Second); err != nil {
				t.Fatalf("after %d failed accepts, a dial failed: %v", failures, err)
			}
			select {
			case <-served:
			case <-time.After(5 * time.Second):
				t.Fatal("the stream was never served")
			}
		})
	}
}

func TestASilentDialerIsDroppedAfterThePreAuthDeadline(t *testing.T) {
	_, addr, _ := listening(t)
	c, err := net.Dial("unix", "@"+socketName(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	if took := time.Since(start); !errors.Is(err, io.EOF) || took > 3*time.Second {
		t.Fatalf("a dialer that says nothing was kept %v (read: %v); want about %v", took, err, preAuthTimeout)
	}
}

func TestHandshakesInFlightAreBounded(t *testing.T) {
	lt, err := New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Close()
	lt.preAuth = time.Minute // the silent dialers below stay in flight for the whole test
	addr, err := lt.Listen("", func(s transport.Stream) { s.Close() })
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
		conns = nil
	}
	defer closeAll()
	for range maxHandshakes + 20 {
		c, err := net.Dial("unix", "@"+socketName(t, addr))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for lt.admission.inFlight.Load() != maxHandshakes && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := lt.admission.inFlight.Load(); n != maxHandshakes {
		t.Fatalf("%d set-ups in flight, want the bound %d", n, maxHandshakes)
	}
	// Meanwhile one more is refused at once (its dialer goes on by gRPC) ...
	if err := dialWithin(t, addr, 5*time.Second); err == nil {
		t.Fatal("a dial past the bound of set-ups in flight was taken")
	}
	// ... and once the silent ones hang up (and the listener saw it), a real dialer gets in.
	closeAll()
	deadline = time.Now().Add(10 * time.Second)
	for lt.admission.inFlight.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := dialWithin(t, addr, 5*time.Second); err != nil {
		t.Fatalf("a dial after a flood of silent dialers: %v", err)
	}
}

func TestAnotherUsersConnectionsAreClosedAtOnce(t *testing.T) {
	_, addr, _ := listening(t)
	before := runtime.NumGoroutine()
	asOtherUser(t, "flood", socketName(t, addr), "300")
	time.Sleep(200 * time.Millisecond)
	if grown := runtime.NumGoroutine() - before; grown > 20 {
		t.Fatalf("300 connections of another user left %d more goroutines here", grown)
	}
	if err := dialWithin(t, addr, 2*time.Second); err != nil {
		t.Fatalf("while another user floods the listener, a dial of this user failed: %v", err)
	}
}

func TestProbeCallsANameSquattedByAnotherUserGone(t *testing.T) {
	lt, err := New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Close()
	// The name of a worker that exited: Listen's form, with a pid of no process here.
	name := fmt.Sprintf("tensorplay-rpc/%d/squatted%d", 1<<22+7, time.Now().UnixNano())
	addr := addrPrefix + lt.hostKey + "/" + name
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lt.Probe(ctx, addr); !errors.Is(err, transport.ErrGone) {
		t.Fatalf("probe of a name nobody holds: %v, want ErrGone", err)
	}
	asOtherUser(t, "squat", name, "0")
	if err := lt.Probe(ctx, addr); !errors.Is(err, transport.ErrGone) {
		t.Fatalf("probe of a name another user bound: %v, want ErrGone", err)
	}
}

func TestProbeCallsANameHeldByAnotherProcessGone(t *testing.T) {
	lt, err := New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Close()
	// This process binds a name whose pid is another's (pid 1): not the worker it names.
	name := fmt.Sprintf("tensorplay-rpc/1/held%d", time.Now().UnixNano())
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lt.Probe(ctx, addrPrefix+lt.hostKey+"/"+name); !errors.Is(err, transport.ErrGone) {
		t.Fatalf("probe of a name held by a process other than the one it names: %v, want ErrGone", err)
	}
	// And a real worker's listener is alive.
	_, addr, _ := listening(t)
	if err := lt.Probe(ctx, addr); err != nil {
		t.Fatalf("probe of a live listener: %v", err)
	}
}

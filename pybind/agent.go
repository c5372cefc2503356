package pybind

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/promexport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// Agent is a worker's agent as Python holds it.
type Agent struct {
	agent      *core.Agent
	requests   *mailbox[Request]
	events     *mailbox[Event]
	takenEvent atomic.Pointer[Event] // see TakenEvent

	lendMu   sync.Mutex
	nextLend int64
	lent     map[int64]core.Message // memory Python uses in place, by lend id

	dropMu  sync.Mutex
	dropped []wire.RRefID // referenced nowhere, not yet posted (rrefDropped)

	metrics atomic.Pointer[promexport.Server] // the Prometheus endpoint, if ServeMetrics started one

	shutdownDone chan struct{}
	shutdownErr  error
	shutdownOnce sync.Once
	// drained is closed when a graceful shutdown's barrier is over (core's SetBeforeClose),
	// and released by Python once it has released the RRefs user code still holds;
	// drainedOrDone when that barrier is over or the shutdown ended without one.
	drained, released, drainedOrDone chan struct{}
	releaseOnce, drainedOrDoneOnce   sync.Once
}

// Starter is a join of the world under way (BeginStart).
type Starter struct {
	done        chan struct{}
	storeServed chan string // rank 0's store address, once it listens
	cancel      context.CancelFunc
	agent       *Agent
	err         error
}

// BeginStart starts joining the world and returns at once; Wait reports when the join is
// over, Agent returns its outcome, and Cancel abandons it (as on Ctrl-C). maxMessageSize
// bounds each message sent or received (0: the default); a non-empty token is the world's
// shared secret; non-empty certFile, keyFile and caFile put the world under mutual TLS;
// transports names the transports in order of preference, comma-separated ("" for the
// default: shared memory on this host, gRPC to the others); exposed names, one per line, the
// functions Python serves to every language (Expose) from the moment it joins.
func BeginStart(name string, rank, worldSize int, initMethod string, initTimeoutMs int, maxMessageSize int64, token, certFile, keyFile, caFile, transports, exposed string) *Starter {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Starter{done: make(chan struct{}), storeServed: make(chan string, 1), cancel: cancel}
	go func() {
		defer close(s.done)
		defer recovered(&s.err)
		var tlsFiles *core.TLSFiles
		if certFile != "" || keyFile != "" || caFile != "" {
			tlsFiles = &core.TLSFiles{Cert: certFile, Key: keyFile, CA: caFile}
		}
		var names []string
		if transports != "" {
			if names, s.err = core.ParseTransports(transports); s.err != nil {
				return
			}
		}
		var functions []string
		if exposed != "" {
			functions = strings.Split(exposed, "\n")
			for _, f := range functions {
				if s.err = checkExposedName(f); s.err != nil {
					return
				}
			}
		}
		s.agent, s.err = start(ctx, name, rank, worldSize, initMethod, initTimeoutMs, maxMessageSize, token, tlsFiles, names, functions, s.storeServed)
	}()
	return s
}

// Wait waits up to timeoutMs for the join; it reports whether it is over. An interruptible
// wait also returns, false, as a signal arrives (WatchInterrupts).
func (s *Starter) Wait(timeoutMs int, interruptible bool) bool {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	return awaitClose(s.done, t.C, interruptible)
}

// ServedStore waits up to timeoutMs for rank 0's rendezvous store to listen and returns its
// address ("" if the join ended first, or on timeout): Python publishes it when the store was
// asked for a free port (tcp://host:0).
func (s *Starter) ServedStore(timeoutMs int) string {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case addr := <-s.storeServed:
		return addr
	case <-s.done:
		select { // served just before the join ended
		case addr := <-s.storeServed:
			return addr
		default:
			return ""
		}
	case <-t.C:
		return ""
	}
}

// Cancel abandons the join: it fails with a cancellation error and releases what it held.
func (s *Starter) Cancel() {
	s.cancel()
	<-s.done
	if s.agent != nil {
		s.agent.agent.Shutdown(context.Background(), false)
		s.agent, s.err = nil, context.Canceled
	}
}

// Agent waits for the join and returns the agent, or why the world could not be joined.
func (s *Starter) Agent() (*Agent, error) {
	<-s.done
	return s.agent, s.err
}

func start(ctx context.Context, name string, rank, worldSize int, initMethod string, initTimeoutMs int, maxMessageSize int64, token string, tlsFiles *core.TLSFiles, transports, exposed []string, storeServed chan<- string) (*Agent, error) {
	a := &Agent{
		lent:          map[int64]core.Message{},
		shutdownDone:  make(chan struct{}),
		drained:       make(chan struct{}),
		released:      make(chan struct{}),
		drainedOrDone: make(chan struct{}),
	}
	a.requests = newMailbox[Request](a.shutdownDone)
	a.events = newMailbox[Event](a.shutdownDone)
	handlers := map[string]core.Handler{PyMethod: queueHandler{a}}
	for _, f := range exposed {
		handlers[f] = queueHandler{a}
	}
	ag, err := core.Start(ctx, core.Config{
		Name: name, Rank: rank, WorldSize: worldSize, InitMethod: initMethod,
		InitTimeout:    time.Duration(initTimeoutMs) * time.Millisecond,
		MaxMessageSize: maxMessageSize,
		Token:          token,
		TLS:            tlsFiles,
		Transports:     transports,
		Handlers:       handlers,
		OnRRefDropped:  a.rrefDropped,
		StoreServed:    func(addr string) { storeServed <- addr },
	})
	if err != nil {
		return nil, err
	}
	a.agent = ag
	ag.SetBeforeClose(a.releaseUserRRefs)
	// Idle pool threads read the caller's stream for themselves. Set before Python has the
	// agent, so before any take (which reads it without the lock).
	a.requests.read = ag.ServeReading
	logReader.Store(a) // the newest agent's event thread takes Go's log records
	return a, nil
}

// Return takes back memory lent to Python (Segments.Lend) once Python no longer uses it.
func (a *Agent) Return(lendID int64) {
	a.lendMu.Lock()
	msg, ok := a.lent[lendID]
	delete(a.lent, lendID)
	a.lendMu.Unlock()
	if ok {
		msg.Release()
	}
}

// MetricsJSON is core.Agent.Metrics in JSON.
func (a *Agent) MetricsJSON() string {
	b, err := json.Marshal(a.agent.Metrics())
	if err != nil {
		return "{}" // cannot happen for numbers and strings
	}
	return string(b)
}

// ServeMetrics serves this worker's metrics to Prometheus at /metrics, on the host the
// worker listens on and port base + localRank (base 0: a free port); it returns the address.
// Called once, after the join.
func (a *Agent) ServeMetrics(base string, localRank int) (string, error) {
	port, err := promexport.PortFor(base, localRank)
	if err != nil {
		return "", err
	}
	srv, err := promexport.Serve(net.JoinHostPort(a.agent.ListenHost(), port), a.agent)
	if err != nil {
		return "", err
	}
	a.metrics.Store(srv)
	return srv.Addr(), nil
}

// Goroutines is the number of goroutines in this process (tests look for leaks with it).
func (a *Agent) Goroutines() int { return runtime.NumGoroutine() }

// Lent is the number of received messages Python still uses in place.
func (a *Agent) Lent() int {
	a.lendMu.Lock()
	defer a.lendMu.Unlock()
	return len(a.lent)
}

// Name is this worker's name.
func (a *Agent) Name() string { return a.agent.Self().Name }

// Addr is the address this worker listens on for its peers' streams ("host:port"). Tests
// point crafted clients at it; the rendezvous table is where peers learn it.
func (a *Agent) Addr() string { return a.agent.Self().Addr }

// ID is this worker's rank.
func (a *Agent) ID() int { return a.agent.Self().ID }

// WorldVersion numbers this worker's view of the world: it grows whenever a worker joins or
// leaves a dynamic world (Python reads Members again then).
func (a *Agent) WorldVersion() int64 { return int64(a.agent.WorldVersion()) }

// MemberEpoch identifies the member of that id now (core.Agent.MemberEpoch): -1 if none,
// and another value once it left and joined again.
func (a *Agent) MemberEpoch(id int) int64 { return a.agent.MemberEpoch(id) }

// RefreshWorld reads a dynamic world's membership from the store, waiting at most timeoutMs
// (core.Agent.RefreshWorld).
func (a *Agent) RefreshWorld(timeoutMs int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeoutMs)*time.Millisecond)
	defer cancel()
	return a.agent.RefreshWorld(ctx)
}

// Members lists the workers of the world now, one "id name" line each, by id (names hold no
// spaces or newlines).
func (a *Agent) Members() string {
	var b strings.Builder
	for _, w := range a.agent.Workers() {
		fmt.Fprintf(&b, "%d %s\n", w.ID, w.Name)
	}
	return b.String()
}

// Closed reports whether the agent's shutdown is complete.
func (a *Agent) Closed() bool {
	select {
	case <-a.shutdownDone:
		return true
	default:
		return false
	}
}

// BeginShutdown starts leaving the world; WaitShutdown reports when it is done. A graceful
// shutdown waits, for at most timeoutMs if it is positive, for every worker to shut down.
func (a *Agent) BeginShutdown(graceful bool, timeoutMs int) {
	a.shutdownOnce.Do(func() {
		go func() {
			defer func() {
				close(a.shutdownDone)
				a.drainedOrDoneOnce.Do(func() { close(a.drainedOrDone) })
				a.requests.wakeAll()
				a.events.wakeAll()
			}()
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if timeoutMs > 0 {
				ctx, cancel = context.WithTimeout(ctx, time.Duration(timeoutMs)*time.Millisecond)
			}
			defer cancel()
			a.shutdownErr = a.agent.Shutdown(ctx, graceful)
			if m := a.metrics.Load(); m != nil {
				m.Close(ctx)
			}
		}()
	})
}

// releaseUserRRefs runs once a graceful shutdown's barrier is over: Python, which waits for
// it (WaitDrained), releases the RRefs user code still holds, and says so (UserRRefsReleased);
// a Python that does not is waited for at most userRRefsWait.
func (a *Agent) releaseUserRRefs(ctx context.Context) {
	close(a.drained)
	a.drainedOrDoneOnce.Do(func() { close(a.drainedOrDone) })
	t := time.NewTimer(userRRefsWait)
	defer t.Stop()
	select {
	case <-a.released:
	case <-ctx.Done():
	case <-t.C:
	}
}

// userRRefsWait bounds how long a graceful shutdown waits for Python to release its RRefs.
const userRRefsWait = 10 * time.Second

// WaitDrained waits up to timeoutMs until a graceful shutdown's barrier is over (Python is to
// release its RRefs, then call UserRRefsReleased) or the shutdown has ended without one; it
// reports whether either happened. An interruptible wait also returns, false, as WaitShutdown.
func (a *Agent) WaitDrained(timeoutMs int, interruptible bool) bool {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	return awaitClose(a.drainedOrDone, t.C, interruptible)
}

// Drained reports whether a graceful shutdown's barrier is over and waits for Python to
// release its RRefs.
func (a *Agent) Drained() bool {
	select {
	case <-a.drained:
		return true
	default:
		return false
	}
}

// UserRRefsReleased lets a graceful shutdown waiting in releaseUserRRefs go on.
func (a *Agent) UserRRefsReleased() { a.releaseOnce.Do(func() { close(a.released) }) }

// ShutdownTimedOut reports whether the shutdown ended by its timeout (a graceful one whose
// barrier some worker did not reach in time); the agent is closed all the same.
func (a *Agent) ShutdownTimedOut() bool {
	select {
	case <-a.shutdownDone:
		return errors.Is(a.shutdownErr, core.ErrShutdownTimedOut)
	default:
		return false
	}
}

// WaitShutdown waits up to timeoutMs for the shutdown BeginShutdown started; it reports
// whether it is done, and its error. An interruptible wait also returns, not done, as a
// signal arrives (WatchInterrupts).
func (a *Agent) WaitShutdown(timeoutMs int, interruptible bool) (bool, error) {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	if !awaitClose(a.shutdownDone, t.C, interruptible) {
		return false, nil
	}
	logReader.CompareAndSwap(a, nil) // Python takes what is left itself (api.shutdown)
	return true, a.shutdownErr
}

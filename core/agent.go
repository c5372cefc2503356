package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// calleeDeadlineGrace is how much longer than the caller a callee lets a handler run.
const calleeDeadlineGrace = 50 * time.Millisecond

// Defaults for zero Config fields.
const (
	DefaultInitTimeout    = 60 * time.Second
	DefaultMaxMessageSize = 4 << 30
	DefaultChunkSize      = 1 << 20
	// DefaultMaxServedPerCaller bounds the calls of one caller being served at once.
	DefaultMaxServedPerCaller = 1024
)

// maxMethodName bounds a method name: names are short, and a request's head must fit a frame.
const maxMethodName = 1024

// Config describes one worker of a world.
type Config struct {
	// Name is the worker's unique name (see ValidateName).
	Name string
	// Rank is the worker's id, in [0, WorldSize). Rank 0 hosts the rendezvous store.
	Rank int
	// WorldSize is the number of workers.
	WorldSize int
	// InitMethod locates the store: "env://" (the default; MASTER_ADDR and MASTER_PORT) or
	// "tcp://host:port". Ignored when Store is set.
	InitMethod string
	// InitTimeout bounds how long Start waits for the whole world; 0 means DefaultInitTimeout.
	InitTimeout time.Duration
	// ListenHost is the address to listen on and advertise; empty means the local address
	// that routes to the store.
	ListenHost string
	// Handlers are registered before the agent can receive its first call.
	Handlers map[string]Handler
	// Token, if set, is the world's shared secret: every connection to the store and to every
	// worker must present it before anything it sends is decoded.
	Token string
	// TLS, if set, puts every connection under mutual TLS with the world's CA.
	TLS *TLSFiles
	// Transport carries calls; nil means a new GRPCTransport.
	Transport Transport
	// Store is used instead of the one InitMethod names, e.g. a MemStore in tests.
	Store Store
	// Logger receives warnings; nil means slog.Default().
	Logger *slog.Logger
	// MaxMessageSize bounds the payload plus buffers of one message, sent or received; 0 means
	// DefaultMaxMessageSize.
	MaxMessageSize int64
	// ChunkSize is the most a frame carries: bigger messages travel in chunks of this size,
	// interleaved with other traffic; 0 means DefaultChunkSize. At most 8 MiB.
	ChunkSize int
	// ReceiveBudget bounds the memory of big messages being received at once, from all peers
	// together; 0 means DefaultReceiveBudget. A message that does not fit waits, and its
	// sender is slowed by flow control; one bigger than the whole budget fails its call.
	ReceiveBudget int64
	// MaxServedPerCaller bounds the calls of one caller being served at once; 0 means
	// DefaultMaxServedPerCaller. When a caller has that many, its stream is not read until
	// one is answered, so flow control slows it instead of work piling up here.
	MaxServedPerCaller int
	// OnRRefDropped is called when an RRef this worker owns is referenced nowhere any more,
	// so its value can be dropped. It must not block.
	OnRRefDropped func(RRefID)
}

const (
	stateRunning int32 = iota
	stateDraining
	stateClosed
)

// Agent is one worker's RPC endpoint.
type Agent struct {
	self    WorkerInfo
	workers []WorkerInfo
	byName  map[string]int
	peers   []*peer

	transport   Transport
	store       Store
	storeServer *StoreServer
	leaveStore  func() error // set for stores that need to hear a worker leave
	log         *slog.Logger

	maxMessageSize     int64
	chunkSize          int
	receiveBudget      *receiveBudget
	maxServedPerCaller int

	handlersMu sync.RWMutex
	handlers   map[string]Handler

	nextID      atomic.Uint64
	nextLocalID atomic.Int64

	refs          *refTable
	onRRefDropped func(RRefID)
	releaseMu     sync.Mutex
	releases      map[int][]RefOp // queued releases, by owner
	releaseKick   chan struct{}
	outstanding   atomic.Int64 // calls made and not yet completed
	state         atomic.Int32
	ready         chan struct{} // closed once the world is known
	serveCtx      context.Context
	stopServing   context.CancelFunc
	shutdown      sync.Once

	goneMu sync.Mutex
	gone   []WorkerInfo // found gone while shutting down
}

// Start joins the world described by cfg and returns once every worker knows every other.
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if err := ValidateName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.WorldSize < 1 {
		return nil, fmt.Errorf("world_size must be at least 1, got %d", cfg.WorldSize)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize {
		return nil, fmt.Errorf("rank %d is out of range for world_size %d: ranks run from 0 to %d", cfg.Rank, cfg.WorldSize, cfg.WorldSize-1)
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = DefaultInitTimeout
	}
	if cfg.InitMethod == "" {
		cfg.InitMethod = "env://"
	}
	for _, limit := range []struct {
		name  string
		value int64
	}{
		{"MaxMessageSize", cfg.MaxMessageSize},
		{"ChunkSize", int64(cfg.ChunkSize)},
		{"ReceiveBudget", cfg.ReceiveBudget},
		{"MaxServedPerCaller", int64(cfg.MaxServedPerCaller)},
	} {
		if limit.value < 0 {
			return nil, fmt.Errorf("config: %s must not be negative, got %d (0 means the default)", limit.name, limit.value)
		}
	}
	a := &Agent{
		transport: cfg.Transport,
		store:     cfg.Store,
		log:       cfg.Logger,
		handlers:  map[string]Handler{},
		ready:     make(chan struct{}),

		maxMessageSize:     cmp.Or(cfg.MaxMessageSize, DefaultMaxMessageSize),
		chunkSize:          min(cmp.Or(cfg.ChunkSize, DefaultChunkSize), maxFrameBytes/2),
		maxServedPerCaller: cmp.Or(cfg.MaxServedPerCaller, DefaultMaxServedPerCaller),

		refs:          newRefTable(),
		onRRefDropped: cfg.OnRRefDropped,
		releaseKick:   make(chan struct{}, 1),
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	a.receiveBudget = newReceiveBudget(cmp.Or(cfg.ReceiveBudget, DefaultReceiveBudget(a.maxMessageSize)))
	if a.transport == nil {
		t, err := NewGRPCTransport(cfg.Token, cfg.TLS)
		if err != nil {
			return nil, err
		}
		a.transport = t
	}
	for m, h := range cfg.Handlers {
		a.handlers[m] = h
	}
	a.serveCtx, a.stopServing = context.WithCancel(context.Background())
	if err := a.start(ctx, cfg); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

func (a *Agent) start(ctx context.Context, cfg Config) error {
	host := cfg.ListenHost
	if a.store == nil {
		var err error
		if host, err = a.openStore(cfg, host); err != nil {
			return err
		}
	}
	addr, err := a.transport.Listen(host, a.serveStream)
	if err != nil {
		return err
	}
	a.self = WorkerInfo{Name: cfg.Name, ID: cfg.Rank, Addr: addr}
	// The store itself gives up after InitTimeout and names the missing ranks; the slack lets
	// its answer arrive.
	ctx, cancel := context.WithTimeout(ctx, cfg.InitTimeout+storeReplySlack)
	defer cancel()
	workers, err := join(ctx, a.store, a.self, cfg.WorldSize, cfg.InitTimeout)
	if err != nil {
		return err
	}
	a.workers = workers
	a.byName = make(map[string]int, len(workers))
	a.peers = make([]*peer, len(workers))
	for id, w := range workers {
		a.byName[w.Name] = id
		a.peers[id] = &peer{agent: a, info: w}
	}
	close(a.ready)
	go a.sendReleases()
	return nil
}

// openStore opens the store cfg.InitMethod names (serving it on rank 0 for tcp and env) and
// returns the host to listen on: the given one, or one peers can reach given the store.
func (a *Agent) openStore(cfg Config, host string) (string, error) {
	if path, ok := strings.CutPrefix(cfg.InitMethod, "file://"); ok {
		if path == "" {
			return "", fmt.Errorf("init_method %q names no file", cfg.InitMethod)
		}
		fs := NewFileStore(path)
		a.store = fs
		a.leaveStore = func() error { return fs.leave(cfg.Rank, cfg.WorldSize) }
		// A file every worker opens suggests one machine: loopback unless told otherwise.
		return cmp.Or(host, "127.0.0.1"), nil
	}
	addr, err := StoreAddress(cfg.InitMethod, os.Getenv)
	if err != nil {
		return "", err
	}
	if cfg.Rank == 0 {
		mem := NewMemStore()
		if a.storeServer, err = ServeStore(addr, mem, cfg.Token, cfg.TLS); err != nil {
			return "", fmt.Errorf("%w: %w (is another world using this MASTER_PORT?)", ErrRendezvous, err)
		}
		a.store = mem
	} else if a.store, err = DialStore(addr, cfg.Token, cfg.TLS); err != nil {
		return "", err
	}
	if host == "" {
		if host, err = hostToward(addr); err != nil {
			return "", fmt.Errorf("%w: %w", ErrRendezvous, err)
		}
	}
	return host, nil
}

// Self is this worker.
func (a *Agent) Self() WorkerInfo { return a.self }

// Workers lists every worker of the world, indexed by id.
func (a *Agent) Workers() []WorkerInfo { return append([]WorkerInfo(nil), a.workers...) }

// Worker looks a worker up by name.
func (a *Agent) Worker(name string) (WorkerInfo, bool) {
	id, ok := a.byName[name]
	if !ok {
		return WorkerInfo{}, false
	}
	return a.workers[id], true
}

// ReceiveMemory reports the bytes of big messages being received now, reserved from the
// receive budget, and the budget.
func (a *Agent) ReceiveMemory() (inUse, budget int64) {
	return a.receiveBudget.inUse(), a.receiveBudget.limit
}

// Register adds or replaces the handler of method.
func (a *Agent) Register(method string, h Handler) {
	a.handlersMu.Lock()
	a.handlers[method] = h
	a.handlersMu.Unlock()
}

func (a *Agent) handler(method string) Handler {
	a.handlersMu.RLock()
	defer a.handlersMu.RUnlock()
	return a.handlers[method]
}

// Call runs method on worker to and waits for its reply, at most until ctx is done.
func (a *Agent) Call(ctx context.Context, to, method string, req Message) (Message, error) {
	return a.CallAsync(ctx, to, method, req).Result()
}

// CallAsync starts a call of method on worker to and returns at once. The call fails with
// ErrTimeout when ctx's deadline passes, ErrCanceled when ctx is canceled, ErrPeerLost when the
// stream to the worker breaks, and a *RemoteError when the handler fails.
func (a *Agent) CallAsync(ctx context.Context, to, method string, req Message) *CallFuture {
	f := newCallFuture()
	id, ok := a.byName[to]
	if !ok {
		f.complete(Message{}, fmt.Errorf("%w: %q is not a worker of this world", ErrUnknownWorker, to))
		return f
	}
	return a.callID(ctx, id, method, req, f)
}

// CallID is CallAsync with the destination given by worker id.
func (a *Agent) CallID(ctx context.Context, to int, method string, req Message) *CallFuture {
	f := newCallFuture()
	if to < 0 || to >= len(a.workers) {
		f.complete(Message{}, fmt.Errorf("%w: id %d is not a worker of this world (world size %d)", ErrUnknownWorker, to, len(a.workers)))
		return f
	}
	return a.callID(ctx, to, method, req, f)
}

func (a *Agent) callID(ctx context.Context, to int, method string, req Message, f *CallFuture) *CallFuture {
	if a.state.Load() == stateClosed {
		f.complete(Message{}, fmt.Errorf("%w: cannot call worker %q", ErrShutdown, a.workers[to].Name))
		return f
	}
	if err := ctx.Err(); err != nil {
		f.complete(Message{}, a.contextError(ctx, a.workers[to].Name))
		return f
	}
	if len(method) > maxMethodName {
		f.complete(Message{}, fmt.Errorf("the method name for worker %q is %d bytes long, more than %d", a.workers[to].Name, len(method), maxMethodName))
		return f
	}
	if size := int64(req.Size()); size > a.maxMessageSize {
		f.complete(Message{}, fmt.Errorf("%w: the call to worker %q carries %d bytes, over the %d-byte limit; nothing was sent", ErrTooLarge, a.workers[to].Name, size, a.maxMessageSize))
		return f
	}
	a.outstanding.Add(1)
	id := a.nextID.Add(1)
	frame := &Frame{Kind: FrameRequest, ID: id, Method: method}
	if dl, ok := ctx.Deadline(); ok {
		frame.TimeoutMs = max(1, time.Until(dl).Milliseconds())
	}
	name := a.workers[to].Name

	// The deadline watcher may fire before the call is sent or while it is pending: it takes
	// the call out of whichever stream table holds it and fails it.
	var conn atomic.Pointer[peerConn]
	var stopWatch atomic.Pointer[func() bool]
	f.onDone = func() {
		a.outstanding.Add(-1)
		if stop := stopWatch.Load(); stop != nil {
			(*stop)()
		}
	}
	stop := context.AfterFunc(ctx, func() {
		if c := conn.Load(); c != nil {
			c.take(id)
		}
		f.complete(Message{}, a.contextError(ctx, name))
		f.abortSend()
	})
	stopWatch.Store(&stop)
	if to == a.self.ID {
		a.dispatch(a.serveCtx, a.self, frame, req, func(resp *Frame, msg Message) <-chan struct{} {
			msg, err := responseResult(resp, msg, name)
			f.complete(msg, err)
			return closedChan
		})
		return f
	}
	c, err := a.peers[to].connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			err = a.contextError(ctx, name)
		}
		f.complete(Message{}, err)
		return f
	}
	conn.Store(c)
	if err := c.send(id, f, frame, req); err != nil {
		f.complete(Message{}, err)
	}
	select {
	case <-f.done: // the watcher may have fired before conn was set: drop the entry
		c.take(id)
	default:
	}
	return f
}

// contextError explains why ctx ended a call to worker.
func (a *Agent) contextError(ctx context.Context, worker string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: the call to worker %q ran past its deadline", ErrTimeout, worker)
	}
	return fmt.Errorf("%w: the call to worker %q was canceled", ErrCanceled, worker)
}

// serveStream serves the calls a peer makes over one stream.
func (a *Agent) serveStream(s Stream) {
	caller := WorkerInfo{Name: "an unidentified peer"}
	defer func() {
		if r := recover(); r != nil {
			reportPanic(a.log, caller.Name, "serving a caller's stream", r, nil)
		}
	}()
	hello, err := s.Recv()
	if err != nil {
		return
	}
	select {
	case <-a.ready:
	case <-a.serveCtx.Done():
		return
	}
	if hello.Kind != FrameHello || hello.CallerID < 0 || hello.CallerID >= len(a.workers) || a.workers[hello.CallerID].Name != hello.Method {
		a.log.Warn("tensorplay-rpc: refused a stream that did not open with a valid hello", "worker", a.self.Name, "from", streamOrigin(s))
		return
	}
	if err := a.checkIdentity(s, a.workers[hello.CallerID]); err != nil {
		a.log.Warn("tensorplay-rpc: refused a stream: "+err.Error(), "worker", a.self.Name)
		return
	}
	caller = a.workers[hello.CallerID]
	// A caller whose stream ends may be gone; the RRef forks it held must not keep values.
	defer func() { go a.forgetIfGone(caller) }()
	ctx, cancel := context.WithCancel(a.serveCtx)
	defer cancel()
	writer := newFrameWriter(s, a.chunkSize, func(error) { cancel() })
	defer writer.close(ErrShutdown)
	// Each call being served holds a slot until its reply is sent; with none free the stream
	// is not read, so the caller's flow control, not this worker's memory, takes up the
	// excess.
	slots := make(chan struct{}, a.maxServedPerCaller)
	freeSlot := func() { <-slots }
	reply := func(fr *Frame, msg Message) <-chan struct{} {
		if a.closing() {
			freeSlot()
			return closedChan
		}
		out, err := writer.send(fr, msg, freeSlot)
		if err != nil {
			freeSlot()
			a.log.Debug("tensorplay-rpc: reply not sent", "to", caller.Name, "err", err)
			return closedChan
		}
		return out.sent
	}
	incoming := newReassembler(ctx, a.maxMessageSize, a.receiveBudget)
	incoming.attach(s)
	defer incoming.close()
	for {
		fr, err := s.Recv()
		if err != nil {
			return
		}
		fr, msg, refused, err := incoming.add(fr)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("tensorplay-rpc: dropped a caller that broke the protocol", "from", caller.Name, "err", err)
			}
			return
		}
		if fr == nil {
			continue
		}
		switch fr.Kind {
		case FrameRequest:
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				msg.Release()
				return
			}
			if refused != nil {
				reply(&Frame{Kind: FrameResponse, ID: fr.ID, Status: StatusTooLarge, Error: fmt.Sprintf("the call to %q was refused: %v", a.self.Name, refused)}, Message{})
				continue
			}
			a.dispatch(ctx, caller, fr, msg, reply)
		case FrameRefs:
			a.applyRefOpsFrom(caller, fr.Refs)
		default:
			msg.Release()
			a.log.Warn("tensorplay-rpc: unexpected frame from a caller; ignored", "from", caller.Name, "kind", fr.Kind)
		}
	}
}

// dispatch hands one request carrying msg to its handler; respond queues the response frame
// and returns a channel closed once the response's memory is no longer read.
func (a *Agent) dispatch(ctx context.Context, caller WorkerInfo, req *Frame, msg Message, respond func(*Frame, Message) <-chan struct{}) {
	id := req.ID
	h := a.handler(req.Method)
	if h == nil {
		msg.Release()
		respond(&Frame{Kind: FrameResponse, ID: id, Status: StatusNoHandler, Error: fmt.Sprintf("method %q is not registered", truncateText(req.Method, maxMethodName))}, Message{})
		return
	}
	cancel := context.CancelFunc(func() {})
	if req.TimeoutMs > 0 {
		// The grace lets the caller's own timer, not a reply to a give-up, decide the outcome.
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond+calleeDeadlineGrace)
	}
	call := &ServerCall{
		Caller:  caller,
		Method:  req.Method,
		Request: msg,
		ctx:     ctx,
		maxSize: a.maxMessageSize,
		log:     a.log,
		respond: func(resp *Frame, m Message) <-chan struct{} {
			cancel()
			resp.ID = id
			return respond(resp, m)
		},
	}
	// A handler that panics fails its own call; the stream goes on serving.
	defer func() {
		if r := recover(); r != nil {
			reportPanic(a.log, caller.Name, "running the handler of "+truncateText(req.Method, maxMethodName), r, call.Fail)
		}
	}()
	h.ServeRPC(call)
}

// closing reports whether shutdown has begun closing the agent.
func (a *Agent) closing() bool { return a.state.Load() == stateClosed }

// Shutdown leaves the world. Graceful shutdown is a barrier: it waits until this worker's own
// calls have completed and every other worker has called Shutdown too, so no worker stops
// while others still call it; ctx bounds the wait. Non-graceful shutdown closes at once and
// fails pending calls with ErrShutdown. Only the first call does anything.
func (a *Agent) Shutdown(ctx context.Context, graceful bool) error {
	err := ErrShutdown
	a.shutdown.Do(func() {
		err = nil
		if graceful {
			err = a.drain(ctx)
		}
		a.close()
	})
	return err
}

func (a *Agent) drain(ctx context.Context) error {
	a.state.Store(stateDraining)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for a.outstanding.Load() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("graceful shutdown: %d calls of this worker still pending: %w", a.outstanding.Load(), ctx.Err())
		}
	}
	// Releases still queued go out before the barrier, so owners see them before anyone
	// closes.
	a.flushReleases(ctx)
	var wait time.Duration
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if mem, ok := a.store.(*MemStore); ok {
		// This worker hosts the store: while the barrier waits, it looks for workers that are
		// gone, so the others do not wait for them forever.
		stop := a.watchForGone(mem, shutdownRound)
		defer stop()
	}
	values, err := a.store.Gather(ctx, GatherRequest{
		Round: shutdownRound, Rank: a.self.ID, Size: len(a.workers), Who: fmt.Sprintf("%q", a.self.Name),
		Value: []byte{1}, WaitMs: wait.Milliseconds(), FailFast: true,
	})
	if errors.Is(err, ErrPeerLost) {
		a.noteGone(0, "it hosted the rendezvous store; leaving without the shutdown barrier")
		return nil
	}
	if err != nil {
		return fmt.Errorf("graceful shutdown barrier: %w", err)
	}
	for rank, v := range values {
		if v == nil {
			a.noteGone(rank, "graceful shutdown did not wait for it")
		}
	}
	return nil
}

const (
	shutdownRound = "shutdown"
	// goneProbeEvery is how often the store's host looks for gone workers during a barrier.
	goneProbeEvery = 300 * time.Millisecond
)

// watchForGone marks workers whose agents no longer answer as gone in round, until stopped.
func (a *Agent) watchForGone(store *MemStore, round string) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(goneProbeEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for _, w := range a.workers {
				if w.ID != a.self.ID && !a.answers(w) {
					store.MarkGone(round, w.ID)
				}
			}
		}
	}()
	return func() { close(done) }
}

// answers reports whether worker's agent accepts a connection.
func (a *Agent) answers(w WorkerInfo) bool {
	ctx, cancel := context.WithTimeout(a.serveCtx, time.Second)
	defer cancel()
	s, err := a.transport.Dial(ctx, w.Addr)
	if err != nil {
		return false
	}
	s.Close()
	return true
}

// forgetIfGone drops the RRef forks worker held if its agent no longer answers: a dead
// worker will never release them.
func (a *Agent) forgetIfGone(w WorkerInfo) {
	if a.closing() || a.answers(w) {
		return
	}
	dropped := a.refs.releaseHolder(w.ID)
	if len(dropped) > 0 {
		a.log.Warn("tensorplay-rpc: dropped RRefs held only by a worker that is gone", "worker", w.Name, "count", len(dropped))
	}
	for _, id := range dropped {
		if a.onRRefDropped != nil {
			a.onRRefDropped(id)
		}
	}
}

// noteGone records and logs that worker rank is gone.
func (a *Agent) noteGone(rank int, why string) {
	a.goneMu.Lock()
	defer a.goneMu.Unlock()
	for _, g := range a.gone {
		if g.ID == rank {
			return
		}
	}
	w := a.workers[rank]
	a.gone = append(a.gone, w)
	a.log.Warn(fmt.Sprintf("tensorplay-rpc: worker %q is gone: %s", w.Name, why), "worker", a.self.Name)
}

// Gone lists the workers this one found gone while shutting down.
func (a *Agent) Gone() []WorkerInfo {
	a.goneMu.Lock()
	defer a.goneMu.Unlock()
	return append([]WorkerInfo(nil), a.gone...)
}

// close stops serving and fails whatever is still pending.
func (a *Agent) close() {
	a.state.Store(stateClosed)
	// The transport goes first: handlers that see their context end must not get a reply out.
	a.transport.Close()
	a.stopServing()
	for _, p := range a.peers {
		p.mu.Lock()
		c := p.conn
		p.mu.Unlock()
		if c != nil {
			c.fail(ErrShutdown)
		}
	}
	if a.storeServer != nil {
		a.storeServer.Close()
	}
	if a.leaveStore != nil && a.workers != nil {
		if err := a.leaveStore(); err != nil {
			a.log.Warn("tensorplay-rpc: leaving the store", "err", err)
		}
	}
	if a.store != nil {
		a.store.Close()
	}
}

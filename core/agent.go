package core

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/rendezvous"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// Defaults for zero Config fields.
const (
	DefaultInitTimeout    = 60 * time.Second
	DefaultMaxMessageSize = 4 << 30
	DefaultChunkSize      = 1 << 20
	// DefaultMaxServedPerCaller bounds the calls of one caller being served at once.
	DefaultMaxServedPerCaller = 1024
)

// Config describes one worker of a world.
type Config struct {
	// Name is the worker's unique name (see ValidateName).
	Name string
	// Rank is the worker's id, in [0, WorldSize) (any id not in use in a dynamic world).
	// Rank 0 hosts the rendezvous store.
	Rank int
	// WorldSize is the number of workers; 0 makes a dynamic world (torch's world_size=None),
	// which workers join and leave one at a time (see membership.go). A dynamic world's
	// rank 0 holds its membership and must use a tcp:// or env:// InitMethod.
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
	// worker must present it before anything it sends is decoded. Empty means the environment
	// variable TokenEnv, as for Python workers.
	Token string
	// TLS, if set, puts every connection under mutual TLS with the world's CA.
	TLS *TLSFiles
	// Transport carries calls; nil means the transports Transports names.
	Transport transport.Transport
	// Transports names the transports that carry calls when Transport is nil, in order of
	// preference: TransportSHM (shared memory, to workers on this host and network
	// namespace), TransportTCP and TransportGRPC (to any worker). Empty means the environment
	// variable TENSORPLAY_RPC_TRANSPORTS (e.g. "tcp") if set, else DefaultTransports. Workers that
	// share no transport cannot call each other.
	Transports []string
	// Store is used instead of the one InitMethod names, e.g. a rendezvous.MemStore in tests.
	Store rendezvous.Store
	// StoreServed, if set, is called on rank 0 with the address its rendezvous store listens
	// on, before the others are waited for: a store at "tcp://host:0" gets a free port, which
	// the program then publishes to the others (as Python does through torch's store).
	StoreServed func(addr string)
	// Logger receives warnings; nil means slog.Default().
	Logger *slog.Logger
	// MaxMessageSize bounds the payload plus buffers of one message, sent or received; 0 means
	// DefaultMaxMessageSize.
	MaxMessageSize int64
	// ChunkSize is the most a frame carries: bigger messages travel in chunks of this size,
	// interleaved with other traffic; 0 means DefaultChunkSize. At most 8 MiB.
	ChunkSize int
	// ReceiveBudget bounds the memory of big messages being received at once, from all peers
	// together; 0 means the environment variable TENSORPLAY_RPC_RECEIVE_BUDGET (bytes) if set,
	// else DefaultReceiveBudget. A message that does not fit waits, and its
	// sender is slowed by flow control; one bigger than the whole budget fails its call.
	ReceiveBudget int64
	// MaxServedPerCaller bounds the calls of one caller being served at once; 0 means
	// DefaultMaxServedPerCaller. When a caller has that many, its stream is not read until
	// one is answered, so flow control slows it instead of work piling up here.
	MaxServedPerCaller int
	// PeerTimeout bounds how long calls wait on a peer that stopped answering without closing
	// its connections (see DefaultPeerTimeout); 0 means the environment variable
	// TENSORPLAY_RPC_PEER_TIMEOUT (seconds) if set, else DefaultPeerTimeout. At least
	// MinPeerTimeout.
	PeerTimeout time.Duration
	// OnRRefDropped is called when an RRef this worker owns is referenced nowhere any more,
	// so its value can be dropped. It must not block.
	OnRRefDropped func(wire.RRefID)
}

const (
	stateRunning int32 = iota
	stateDraining
	stateClosed
)

// Agent is one worker's RPC endpoint.
type Agent struct {
	self       WorkerInfo
	listenHost string // the host this agent listens on
	// view is the world now (world.go); worldMu orders its changes in a dynamic world.
	view    atomic.Pointer[world]
	worldMu sync.Mutex
	dynamic bool   // Config.WorldSize 0: workers join and leave one at a time (membership.go)
	epoch   uint64 // in a dynamic world, the store's version when this worker joined
	leftMu  sync.Mutex
	left    map[int]WorkerInfo // workers that left, by id, to name them in errors

	transport transport.Transport
	// selfReadFrames counts the frames threads read themselves (CallFuture.AwaitReading,
	// ServeReading), for tests.
	selfReadFrames atomic.Int64
	// lastServed is the stream of the caller served last, if threads may read it
	// (ServeReading).
	lastServed  atomic.Pointer[servedStream]
	store       rendezvous.Store
	storeServer *rendezvous.StoreServer
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
	onRRefDropped func(wire.RRefID)
	// values are the RRef values this worker keeps for remote() of its handlers (owned_values.go).
	values        ownedValues
	refFlushArmed atomic.Bool // a timer will send the queued reference operations (peer.refLog)
	refRetryArmed atomic.Bool // a timer will try again those an owner could not be sent (flushRefOps)
	// refSeqMu orders the application of a worker's reference operations across its streams
	// (see applyRefOpsFrom).
	refSeqMu    sync.Mutex
	peerTimeout time.Duration             // see Config.PeerTimeout
	beforeClose func(ctx context.Context) // see SetBeforeClose
	// beforeCreate, in tests, runs between remoteHandler's check of a new RRef's forks and
	// the making of its slot (a release may come in between).
	beforeCreate func(wire.RRefID)
	outstanding  atomic.Int64 // calls made and not yet completed
	started      atomic.Int64 // calls made, ever: the shutdown barrier compares them
	state        atomic.Int32
	ready        chan struct{} // closed once the world is known
	serveCtx     context.Context
	stopServing  context.CancelFunc
	shutdown     sync.Once

	goneMu sync.Mutex
	gone   []WorkerInfo // found gone while shutting down
}

// TokenEnv is the environment variable that holds the world's token when Config.Token is
// empty.
const TokenEnv = "TENSORPLAY_RPC_TOKEN"

// Start joins the world described by cfg and returns once every worker knows every other.
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if err := ValidateName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.WorldSize < 0 {
		return nil, fmt.Errorf("world_size must be at least 1 (or 0 for a dynamic world), got %d", cfg.WorldSize)
	}
	if cfg.WorldSize == 0 && cfg.Rank < 0 {
		return nil, fmt.Errorf("rank %d is negative: a worker of a dynamic world needs a rank of 0 or more", cfg.Rank)
	}
	if cfg.WorldSize > 0 && (cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize) {
		return nil, fmt.Errorf("rank %d is out of range for world_size %d: ranks run from 0 to %d", cfg.Rank, cfg.WorldSize, cfg.WorldSize-1)
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = DefaultInitTimeout
	}
	if cfg.InitMethod == "" {
		cfg.InitMethod = "env://"
	}
	cfg.Token = cmp.Or(cfg.Token, os.Getenv(TokenEnv))
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
		dynamic:   cfg.WorldSize == 0,
		transport: cfg.Transport,
		store:     cfg.Store,
		log:       cfg.Logger,
		handlers:  map[string]Handler{},
		ready:     make(chan struct{}),

		maxMessageSize:     cmp.Or(cfg.MaxMessageSize, DefaultMaxMessageSize),
		chunkSize:          min(cmp.Or(cfg.ChunkSize, DefaultChunkSize), wire.MaxFrameBytes/2),
		maxServedPerCaller: cmp.Or(cfg.MaxServedPerCaller, DefaultMaxServedPerCaller),

		refs:          newRefTable(),
		onRRefDropped: cfg.OnRRefDropped,
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	budget, err := receiveBudgetFromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	a.receiveBudget = newReceiveBudget(cmp.Or(cfg.ReceiveBudget, budget, DefaultReceiveBudget(a.maxMessageSize)), a.log)
	if cfg.PeerTimeout, err = resolvePeerTimeout(cfg.PeerTimeout, os.Getenv); err != nil {
		return nil, err
	}
	a.peerTimeout = cfg.PeerTimeout
	if a.transport == nil {
		if a.transport, err = newTransport(cfg, os.Getenv); err != nil {
			return nil, err
		}
	}
	for m, h := range cfg.Handlers {
		a.handlers[m] = h
	}
	a.handlers[RemoteMethod] = remoteHandler{a}
	a.handlers[FetchMethod] = fetchHandler{a}
	a.handlers[appliedMethod] = HandlerFunc(func(context.Context, Message) (Message, error) { return Message{}, nil })
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
	a.listenHost = host
	a.self = WorkerInfo{Name: cfg.Name, ID: cfg.Rank, Addr: addr}
	// The store itself gives up after InitTimeout and names the missing ranks; the slack lets
	// its answer arrive.
	ctx, cancel := context.WithTimeout(ctx, cfg.InitTimeout+rendezvous.ReplySlack)
	defer cancel()
	if a.dynamic {
		return a.joinDynamic(ctx)
	}
	workers, err := join(ctx, a.store, a.self, cfg.WorldSize, cfg.InitTimeout)
	if err != nil {
		return err
	}
	members := make([]*member, len(workers))
	for id, w := range workers {
		members[id] = a.newMember(w, 0)
	}
	a.setWorld(newWorld(1, members))
	close(a.ready)
	return nil
}

// openStore opens the store cfg.InitMethod names (serving it on rank 0 for tcp and env) and
// returns the host to listen on: the given one, or one peers can reach given the store.
func (a *Agent) openStore(cfg Config, host string) (string, error) {
	if path, ok := strings.CutPrefix(cfg.InitMethod, "file://"); ok {
		if path == "" {
			return "", fmt.Errorf("init_method %q names no file", cfg.InitMethod)
		}
		a.store = rendezvous.NewFileStore(path, cfg.Token)
		// A file every worker opens suggests one machine: loopback unless told otherwise.
		return cmp.Or(host, "127.0.0.1"), nil
	}
	addr, err := rendezvous.StoreAddress(cfg.InitMethod, os.Getenv)
	if err != nil {
		return "", err
	}
	if cfg.Rank == 0 {
		mem := rendezvous.NewMemStore(cfg.WorldSize)
		if a.storeServer, err = rendezvous.ServeStore(addr, mem, cfg.Token, cfg.TLS); err != nil {
			return "", fmt.Errorf("%w: %w (is another world using this MASTER_PORT?)", ErrRendezvous, err)
		}
		a.store = mem
		addr = a.storeServer.Addr() // the port it got, if asked for any
		if cfg.StoreServed != nil {
			cfg.StoreServed(addr)
		}
	} else if strings.HasSuffix(addr, ":0") {
		return "", fmt.Errorf("%w: rank %d cannot dial the store at %s: port 0 asks rank 0 for a free port, and the others need the port it got", ErrRendezvous, cfg.Rank, addr)
	} else if a.store, err = rendezvous.DialStore(addr, cfg.Token, cfg.TLS); err != nil {
		return "", err
	}
	if host == "" {
		if host, err = rendezvous.HostToward(addr); err != nil {
			return "", fmt.Errorf("%w: %w", ErrRendezvous, err)
		}
	}
	return host, nil
}

// ReceiveMemory reports the bytes of big messages being received now, reserved from the
// receive budget, and the budget.
func (a *Agent) ReceiveMemory() (inUse, budget int64) {
	return a.receiveBudget.inUse(), a.receiveBudget.limit
}

// Register adds or replaces the handler of method; a nil h removes it. The handler of
// ModuleMethods serves every method named "module:function" that has no handler of its own.
func (a *Agent) Register(method string, h Handler) {
	a.handlersMu.Lock()
	if h == nil {
		delete(a.handlers, method)
	} else {
		a.handlers[method] = h
	}
	a.handlersMu.Unlock()
}

// ModuleMethods is the method name under which a handler serves every "module:function"
// method without a handler of its own: a Python worker registers it when it allows any
// importable function to be called by name (rpc.expose_imports).
const ModuleMethods = ":"

func (a *Agent) handler(method string) Handler {
	a.handlersMu.RLock()
	defer a.handlersMu.RUnlock()
	if h := a.handlers[method]; h != nil {
		return h
	}
	if strings.Contains(method, ":") {
		return a.handlers[ModuleMethods]
	}
	return nil
}

package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/internal/secure"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	storeService    = "tensorplay.rpc.Store"
	storeGatherPath = "/" + storeService + "/Gather"
	storeMemberPath = "/" + storeService + "/Member"
	// storeGrace bounds how long a closing store takes to send the replies it has (the rounds
	// still waiting fail at once: their host is leaving).
	storeGrace = 3 * time.Second
	// ReplySlack is how much longer a client waits than it asks the store to.
	ReplySlack = 2 * time.Second
	// gatherRetryPause spaces a client's attempts after its connection to the store broke.
	gatherRetryPause = 50 * time.Millisecond
)

type gatherReply struct {
	Values [][]byte `msgpack:"values"`
}

// ServeStore serves store on addr ("host:port") over gRPC until the returned server is
// closed; a non-empty token is required of every client, and with tlsFiles mutual TLS.
func ServeStore(addr string, store *MemStore, token string, tlsFiles *secure.TLSFiles) (*StoreServer, error) {
	sec, err := secure.New(token, tlsFiles)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve the rendezvous store on %s: %w", addr, err)
	}
	sec.WarnIfOpen("rendezvous store", lis.Addr().(*net.TCPAddr).IP.String(), "join this world's rounds as any rank, or spoil them")
	// A request is a few small fields and one value of at most maxStoreValueBytes: refusing
	// bigger ones at gRPC spares decoding megabytes only to refuse them.
	srv := grpc.NewServer(append(sec.ServerOptions(), grpc.MaxRecvMsgSize(maxStoreRequestBytes))...)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: storeService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Gather",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (_ any, err error) {
				defer recoverStorePanic(&err)
				var req GatherRequest
				if err := dec(&req); err != nil {
					return nil, err
				}
				values, err := store.Gather(ctx, req)
				if errors.Is(err, errStoreClosed) {
					// Aborted, which the client reads as ErrStoreGone and never retries: the
					// round cannot complete, whatever kind it is.
					return nil, status.Error(codes.Aborted, err.Error())
				}
				if err != nil {
					return nil, status.Error(codes.FailedPrecondition, err.Error())
				}
				return &gatherReply{Values: values}, nil
			},
		}, {
			MethodName: "Member",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (_ any, err error) {
				defer recoverStorePanic(&err)
				var req memberRequest
				if err := dec(&req); err != nil {
					return nil, err
				}
				reply, err := serveMember(ctx, store, req)
				if err != nil {
					return nil, status.Error(codes.FailedPrecondition, err.Error())
				}
				return reply, nil
			},
		}},
	}, struct{}{})
	go srv.Serve(lis)
	return &StoreServer{srv: srv, store: store, addr: lis.Addr().String()}, nil
}

// recoverStorePanic turns a panic of a store handler into an error: gRPC does not recover
// handlers' panics, and one would end rank 0's process, its worker with it.
func recoverStorePanic(err *error) {
	if r := recover(); r != nil {
		slog.Error("tensorplay-rpc: recovered from a panic in the rendezvous store", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "the rendezvous store failed on this request")
	}
}

// StoreServer is a MemStore served over gRPC.
type StoreServer struct {
	srv   *grpc.Server
	store *MemStore
	addr  string
}

// Addr is the address the store listens on.
func (s *StoreServer) Addr() string { return s.addr }

// Close fails the rounds still waiting (this store's host will not join them), lets the
// replies under way go out for a bounded time, then stops.
func (s *StoreServer) Close() error {
	s.store.stopServing()
	done := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(storeGrace):
		s.srv.Stop()
	}
	return nil
}

// RemoteStore is a Store reached over gRPC.
type RemoteStore struct {
	addr string
	cc   *grpc.ClientConn
}

// DialStore returns a client of the store at addr, presenting token if non-empty, over TLS
// with tlsFiles. It connects lazily, retrying until each call's deadline, so workers may start
// before rank 0 does.
func DialStore(addr, token string, tlsFiles *secure.TLSFiles) (*RemoteStore, error) {
	sec, err := secure.New(token, tlsFiles)
	if err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, sec.DialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("dial the rendezvous store at %s: %w", addr, err)
	}
	return &RemoteStore{addr: addr, cc: cc}, nil
}

// Gather implements Store.
func (s *RemoteStore) Gather(ctx context.Context, req GatherRequest) ([][]byte, error) {
	if d := req.wait(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d+ReplySlack)
		defer cancel()
	}
	deadline, bounded := ctx.Deadline()
	var reply gatherReply
	var err error
	for {
		err = s.cc.Invoke(ctx, storeGatherPath, &req, &reply, grpc.WaitForReady(!req.FailFast))
		if err == nil {
			return reply.Values, nil
		}
		// A connection that broke while the store held the request (a blip, a keepalive ping
		// answered late on a loaded host) is no reason to fail a join: the store admits the
		// same participant again. A fail-fast round gives up instead.
		if req.FailFast || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			break
		}
		if bounded {
			left := time.Until(deadline) - ReplySlack
			if left <= 0 {
				break
			}
			req.WaitMs = max(left.Milliseconds(), 1)
		}
		select {
		case <-time.After(gatherRetryPause):
		case <-ctx.Done():
		}
	}
	st := status.Convert(err)
	switch {
	case st.Code() == codes.Unauthenticated:
		return nil, fmt.Errorf("the rendezvous store at %s refused this worker: %s", s.addr, st.Message())
	case st.Code() == codes.FailedPrecondition:
		return nil, errors.New(st.Message())
	case st.Code() == codes.Aborted:
		return nil, fmt.Errorf("%w: %s", ErrStoreGone, st.Message())
	case req.FailFast && st.Code() == codes.Unavailable:
		return nil, fmt.Errorf("%w: round %q: the rendezvous store at %s: %s", ErrStoreGone, req.Round, s.addr, st.Message())
	case st.Code() == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("round %q: could not reach the rendezvous store at %s in time (%s): %s", req.Round, s.addr, s.whyUnreachable(), st.Message())
	default:
		return nil, fmt.Errorf("round %q: rendezvous store at %s: %s", req.Round, s.addr, st.Message())
	}
}

// whyUnreachable guesses why no store answered at s.addr: nothing listens there, or something
// that is not a store of ours does (torch's TCPStore, when the ranks did not all meet the same
// way).
func (s *RemoteStore) whyUnreachable() string {
	conn, err := net.DialTimeout("tcp", s.addr, time.Second)
	if err != nil {
		return "is rank 0 running, and MASTER_ADDR/MASTER_PORT right?"
	}
	conn.Close()
	return "something listens there but does not answer as this package's store: a torch TCPStore? " +
		"Ranks that differ on importing torch before init_rpc meet at different stores; " +
		"set TENSORPLAY_RPC_RENDEZVOUS alike on every rank, or check the token and TLS settings"
}

// JoinMembers implements MemberStore.
func (s *RemoteStore) JoinMembers(ctx context.Context, m Member) (Membership, error) {
	reply, err := s.member(ctx, memberRequest{Op: "join", Member: m})
	if err == nil && reply.Taken != nil {
		return Membership{}, &TakenError{Holder: *reply.Taken, ByName: reply.TakenName}
	}
	return reply.Membership, err
}

// LeaveMembers implements MemberStore.
func (s *RemoteStore) LeaveMembers(ctx context.Context, rank int, epoch uint64) (Membership, bool, error) {
	reply, err := s.member(ctx, memberRequest{Op: "leave", Member: Member{Rank: rank, Epoch: epoch}})
	return reply.Membership, reply.Removed, err
}

// Members implements MemberStore.
func (s *RemoteStore) Members(ctx context.Context) (Membership, error) {
	reply, err := s.member(ctx, memberRequest{Op: "list"})
	return reply.Membership, err
}

// member makes one member request, retrying while the store cannot be reached until ctx ends
// (a joiner may start before rank 0 does; every operation may be repeated safely).
func (s *RemoteStore) member(ctx context.Context, req memberRequest) (memberReply, error) {
	var reply memberReply
	for {
		err := s.cc.Invoke(ctx, storeMemberPath, &req, &reply, grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(maxMembershipBytes))
		if err == nil {
			return reply, nil
		}
		st := status.Convert(err)
		switch {
		case st.Code() == codes.Unavailable && ctx.Err() == nil:
		case st.Code() == codes.Unauthenticated:
			return reply, fmt.Errorf("the rendezvous store at %s refused this worker: %s", s.addr, st.Message())
		case st.Code() == codes.FailedPrecondition:
			return reply, errors.New(st.Message())
		case ctx.Err() != nil:
			return reply, fmt.Errorf("%w: the rendezvous store at %s did not answer in time (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?): %s", ErrStoreGone, s.addr, st.Message())
		default:
			return reply, fmt.Errorf("rendezvous store at %s: %s", s.addr, st.Message())
		}
		select {
		case <-time.After(gatherRetryPause):
		case <-ctx.Done():
		}
	}
}

// Close releases the connection.
func (s *RemoteStore) Close() error { return s.cc.Close() }

// Package core is the tensorplay-rpc agent: the part of a worker that owns the network.
//
// A world is world_size workers, each with a unique name and rank. Every worker starts an
// [Agent] with the same init method; rank 0 serves a small rendezvous store, every agent
// listens on a port the OS picks and publishes its address there, and [Start] returns once all
// workers know each other. Agents then call each other's registered [Handler]s by method name:
// [Agent.Call] blocks, [Agent.CallAsync] returns a [CallFuture]. Deadlines come from the
// caller's context.Context and travel with the request.
//
// # Worlds with Python workers
//
// A Go program joins a world of Python workers (tensorplay_rpc) as a worker of its own, with
// the same init method, token and TLS. Calls between the languages go by function name with
// msgpack values: [Func] makes a plain Go function, such as
// func(ctx context.Context, ids []int64) (map[string][]float64, error), a handler that Python
// calls with rpc.rpc_sync(worker, rpc.remote_function("lookup"), args=(ids,)); [CallFunc]
// calls it from Go, or calls a function a Python worker exposed with rpc.expose, into a typed
// result. numpy arrays and torch tensors cross as [Array] (see [Elements] and [ArrayOf]),
// their data beside the msgpack, not in it. A Python exception arrives as a [*PythonError].
// rpc.remote() of a Go function leaves its result here, counted as every RRef is
// ([RemoteMethod]).
//
// The agent is built from parts in packages of their own, each behind an interface with a
// small in-memory twin that tests use:
//
//   - wire: the Frame every transport carries and its msgpack encoding;
//   - transport: the Transport and Stream interfaces, and transport.InmemNetwork, into whose
//     traffic tests inject faults (frames dropped, delayed or held; links partitioned);
//   - transport/shmtransport: the transport between workers on one host: sealed memfd
//     regions with two lanes of rings per direction, big messages lent or landed in place;
//   - transport/grpctransport: the transport between hosts, two long-lived bidirectional gRPC
//     streams (lanes: small frames, big messages) per (caller, callee) pair on one connection,
//     carrying frames multiplexed by call id;
//   - rendezvous: the Store interface, rendezvous.MemStore (served by rank 0 over gRPC) and
//     rendezvous.FileStore.
//
// In this package: the agent's API and configuration (agent.go), the call path (call.go,
// peer.go, future.go), the callee's loop (serve.go, handler.go), the stream writer and the
// reassembly of big messages under a receive budget (writer.go, reassembly.go,
// receive_budget.go), RRef reference counting (rref.go), who a peer may be (identity.go),
// shutdown and liveness (shutdown.go), the world's membership (world.go, membership.go), and
// calls between languages (func.go, array.go, owned_values.go).
//
// The package has no cgo and no Python: Go programs use it directly, and the Python binding
// (package pybind) is a thin layer on top of it.
package core

// Package core is the tensorplay-rpc agent: the part of a worker that owns the network.
//
// A world is world_size workers, each with a unique name and rank. Every worker starts an
// [Agent] with the same init method; rank 0 serves a small rendezvous [Store], every agent
// listens on a port the OS picks and publishes its address there, and [Start] returns once all
// workers know each other. Agents then call each other's registered [Handler]s by method name:
// [Agent.Call] blocks, [Agent.CallAsync] returns a [CallFuture]. Deadlines come from the
// caller's context.Context and travel with the request.
//
// On the wire, each (caller, callee) pair shares one long-lived bidirectional gRPC stream that
// carries msgpack-encoded [wire.Frame]s multiplexed by call id, so a call costs no connection or
// HTTP/2 stream set-up. When that stream breaks, every call waiting on the peer fails at once
// with an error naming the peer.
//
// The package has no cgo and no Python: Go programs use it directly, and the Python binding
// (package pybind) is a thin layer on top of it. Transport and Store are interfaces with small
// in-memory implementations ([InmemNetwork], [MemStore]) that tests use.
package core

package core

import "context"

// Transport carries frames between agents. Implementations: the gRPC transport used by real
// worlds ([NewGRPCTransport]) and an in-memory one for tests ([InmemNetwork]).
type Transport interface {
	// Listen starts accepting streams on host and returns the address peers dial. For each
	// incoming stream the transport calls serve, which returns when the stream is over.
	Listen(host string, serve func(Stream)) (addr string, err error)
	// Dial opens a stream to the agent listening at addr.
	Dial(ctx context.Context, addr string) (Stream, error)
	// Close stops listening and breaks every stream of this transport.
	Close() error
}

// Stream is one bidirectional frame stream. Send and Recv may run concurrently with each
// other, but Send must not be called concurrently with itself (nor Recv with itself).
type Stream interface {
	Send(f *Frame) error
	// Recv returns the next frame, or an error once the stream is broken or closed.
	Recv() (*Frame, error)
	// Close ends the stream; the peer's Recv then fails.
	Close() error
}

package wire

// RRefID names a value kept on its owner for remote references: the worker that created the
// id and a number unique on that worker.
type RRefID struct {
	_msgpack struct{} `msgpack:",as_array"`
	Creator  int
	Local    int64
}

// ForkID names one reference to an RRef, held by one worker; ids are unique like RRefIDs.
type ForkID = RRefID

// RefOpKind says what a RefOp does to the owner's table.
type RefOpKind uint8

// Reference operations.
const (
	// RefAdd registers a fork: a worker holds, or is about to receive, a reference.
	RefAdd RefOpKind = iota + 1
	// RefRelease says the fork's holder dropped it.
	RefRelease
)

// RefOp is one reference-count change, sent to the RRef's owner.
type RefOp struct {
	_msgpack struct{} `msgpack:",as_array"`
	Kind     RefOpKind
	RRef     RRefID
	Fork     ForkID
	// Holder is the worker that holds (or will hold) the fork.
	Holder int
	// HolderEpoch tells which member of that id holds it: in a dynamic world a worker that
	// leaves and joins again is a new member (core's member epoch); always 0 in a static one.
	HolderEpoch uint64
}

// Command hostilepeer speaks the tensorplay-rpc agent protocol with crafted frames to one live
// worker, to check that a hostile peer cannot crash, starve or impersonate (the pytest test
// tests/test_hostile_peer.py points it at a world of Python workers and watches them).
//
// Each attack runs on a fresh stream and is bounded in time; the program prints one line per
// attack,
//
//	ATTACK <name> <outcome> <detail>
//
// where outcome is one of
//
//	unauthenticated  the worker refused the stream for want of the token
//	dropped          the worker ended the stream (a protocol violation, a refused hello)
//	replied          the worker answered the crafted call (detail: status and error)
//	served           no answer, but a probe on the same stream was answered afterwards
//	silent           neither an answer nor a probe's answer in time (the stream is held)
//	held             the stream was left open on purpose, as the attack intends
//	dial-failed      no stream could be opened
//
// It exits 0 whatever the worker did, 1 if it could not reach the worker at all, 2 on bad
// flags, and by itself within -timeout.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/grpctransport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/shmtransport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/tcptransport"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// probeMethod is registered nowhere: a request for it is answered ReplyNoHandler by Go alone,
// so probing a stream runs no Python code on the worker.
const probeMethod = "hostilepeer.no-such-method"

const mib = 1 << 20

// attack is one named way of misbehaving; it returns its outcome and a detail.
type attack struct {
	name string
	run  func(p *peer, ctx context.Context) (outcome, detail string)
}

var attacks = []attack{
	// First, so its streams stay open while every other attack runs.
	{"half-open", (*peer).halfOpen},
	{"near-limit", (*peer).nearLimit},
	{"wrapping-sizes", (*peer).wrappingSizes},
	{"unknown-chunk", (*peer).unknownChunk},
	{"out-of-order-chunks", (*peer).outOfOrderChunks},
	{"offset-near-maxint", func(p *peer, ctx context.Context) (string, string) {
		return p.badChunk(ctx, math.MaxInt64-2)
	}},
	{"offset-negative", func(p *peer, ctx context.Context) (string, string) { return p.badChunk(ctx, -1) }},
	{"offset-minint", func(p *peer, ctx context.Context) (string, string) { return p.badChunk(ctx, math.MinInt64) }},
	{"chunk-overrun", func(p *peer, ctx context.Context) (string, string) { return p.badChunk(ctx, 60) }},
	{"header-flood", (*peer).headerFlood},
	{"unknown-kinds", (*peer).unknownKinds},
	{"negative-size", (*peer).negativeSize},
	{"release-other-holder", (*peer).releaseOtherHolder},
	{"hello-mismatch", (*peer).helloMismatch},
	{"hello-missing", (*peer).helloMissing},
	{"huge-method", (*peer).hugeMethod},
	// Last: it holds the worker's receive budget for -hold, the longest attack.
	{"budget-hog", (*peer).budgetHog},
}

// peer is the attacker: how it reaches the worker and who it claims to be.
type peer struct {
	tr     transport.Transport
	shm    bool // attacks go over shared memory
	tcp    bool // attacks go over plain TCP
	addr   string
	token  string
	name   string
	rank   int
	window time.Duration // how long to wait for the worker's reaction to one attack
	hold   time.Duration // how long budget-hog holds its announcements

	mu   sync.Mutex
	kept []func() // streams left open until the program ends
}

func main() {
	var (
		addr    = flag.String("addr", "", "the worker's address (as its agent reports it)")
		via     = flag.String("transport", "grpc", "attack over grpc, tcp or shm")
		name    = flag.String("name", "worker1", "the worker name the hello claims")
		rank    = flag.Int("rank", 1, "the rank the hello claims")
		token   = flag.String("token", "", "the token to present (none: a stranger)")
		list    = flag.String("attacks", "all", "comma-separated attacks to run, or all")
		timeout = flag.Duration("timeout", 55*time.Second, "the program ends by itself after this")
		window  = flag.Duration("window", 2*time.Second, "how long to wait for the worker's reaction to one attack")
		hold    = flag.Duration("hold", 8*time.Second, "how long budget-hog holds the receive budget")
	)
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "hostilepeer: -addr is required")
		os.Exit(2)
	}
	chosen, err := choose(*list, *via == "shm")
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostilepeer:", err)
		os.Exit(2)
	}
	// Whatever the worker does (a stream that blocks, a Send that never returns), the
	// program ends on time: the test that runs it must not hang.
	time.AfterFunc(*timeout+5*time.Second, func() {
		fmt.Println("hostilepeer: timed out; exiting")
		os.Exit(0)
	})
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var tr transport.Transport
	switch *via {
	case "grpc":
		tr, err = grpctransport.New(*token, nil)
	case "tcp":
		tr, err = tcptransport.New(*token, nil)
	case "shm":
		tr, err = shmtransport.New(*token, 0)
	default:
		err = fmt.Errorf("-transport %q: want grpc, tcp or shm", *via)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostilepeer:", err)
		os.Exit(2)
	}
	at, ok := transport.ChoiceAddr(*addr, *via)
	if !ok {
		fmt.Fprintf(os.Stderr, "hostilepeer: the worker at %s does not listen on %s\n", *addr, *via)
		os.Exit(2)
	}
	p := &peer{tr: tr, shm: *via == "shm", tcp: *via == "tcp", addr: at, token: *token, name: *name, rank: *rank, window: *window, hold: *hold}
	if err := p.reachable(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "hostilepeer: cannot reach the worker:", err)
		os.Exit(1)
	}
	for _, a := range chosen {
		if ctx.Err() != nil {
			fmt.Printf("ATTACK %s skipped out of time\n", a.name)
			continue
		}
		actx, acancel := context.WithTimeout(ctx, p.window*3+p.hold)
		outcome, detail := a.run(p, actx)
		acancel()
		fmt.Printf("ATTACK %s %s %s\n", a.name, outcome, oneLine(detail))
	}
	p.mu.Lock()
	for _, closeFn := range p.kept {
		closeFn()
	}
	p.mu.Unlock()
	tr.Close()
	fmt.Println("hostilepeer: done")
}

func choose(list string, shm bool) ([]attack, error) {
	all := attacks
	if shm {
		// budget-hog stays last: it holds the worker's budget for -hold.
		all = append(append(slices.Clone(attacks[:len(attacks)-1]), shmAttacks...), attacks[len(attacks)-1])
	}
	if list == "all" || list == "" {
		return all, nil
	}
	var out []attack
	for _, name := range strings.Split(list, ",") {
		i := slices.IndexFunc(all, func(a attack) bool { return a.name == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("unknown attack %q", name)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// reachable checks that something listens at the address: only then are the outcomes of the
// attacks about the worker rather than about the network.
func (p *peer) reachable(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := p.tr.Dial(dctx, p.addr)
	if errors.Is(err, shmtransport.ErrRefused) || errors.Is(err, tcptransport.ErrRefused) {
		return nil // it listens, and refused a stranger
	}
	if err != nil {
		return err
	}
	return s.Close()
}

// conn is one stream to the worker with a reader goroutine, so every wait has a deadline.
type conn struct {
	s      transport.Stream
	frames chan *wire.Frame
	done   chan struct{} // closed when the reader stops; err says why
	err    error
}

func newConn(s transport.Stream) *conn {
	c := &conn{s: s, frames: make(chan *wire.Frame, 1024), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			f, err := s.Recv()
			if err != nil {
				c.err = err
				return
			}
			select {
			case c.frames <- f:
			default: // nobody reads that many answers; dropping them keeps the reader going
			}
		}
	}()
	return c
}

// open dials a fresh stream and sends hello first, if any.
func (p *peer) open(ctx context.Context, hello *wire.Frame) (*conn, error) {
	s, err := p.tr.Dial(ctx, p.addr)
	if err != nil {
		return nil, err
	}
	c := newConn(s)
	if hello != nil {
		if err := s.Send(hello); err != nil {
			// gRPC's Send reports only io.EOF for a stream the server ended; why it ended
			// (a refusal for want of the token, say) is what Recv returns.
			select {
			case <-c.done:
				if c.err != nil {
					err = c.err
				}
			case <-time.After(p.window):
			}
			s.Close()
			return nil, err
		}
	}
	return c, nil
}

func (p *peer) hello() *wire.Frame { return wire.HelloFrame(p.name, p.rank, 0) }

// sendAll sends frames until one fails; it returns how many went.
func (c *conn) sendAll(frames ...*wire.Frame) (int, error) {
	for i, f := range frames {
		if err := c.s.Send(f); err != nil {
			return i, err
		}
	}
	return len(frames), nil
}

// await waits up to d for a frame with the given ID, or for the stream's end.
func (c *conn) await(ctx context.Context, d time.Duration, id uint64) (*wire.Frame, error, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case f := <-c.frames:
			if f.ID == id {
				return f, nil, true
			}
		case <-c.done:
			return nil, c.err, true
		case <-t.C:
			return nil, nil, false
		case <-ctx.Done():
			return nil, nil, false
		}
	}
}

// react waits for the answer to call id; if none comes in the window, it probes the stream
// to tell a worker that ignored the frames (served) from one that is stuck (silent).
func (p *peer) react(ctx context.Context, c *conn, id uint64, sent string) (string, string) {
	f, err, ok := c.await(ctx, p.window, id)
	switch {
	case ok && f != nil:
		return "replied", fmt.Sprintf("%s; status %d: %s%s", sent, f.Status, truncate(f.Error, 200), p.probe(ctx, c))
	case ok:
		return endOutcome(err), sent + "; " + describe(err)
	}
	probeID := uint64(1<<63 + 1)
	if _, err := c.sendAll(&wire.Frame{Kind: wire.FrameRequest, ID: probeID, Method: probeMethod}); err != nil {
		return endOutcome(err), sent + "; probe not sent: " + describe(err)
	}
	f, err, ok = c.await(ctx, p.window, probeID)
	switch {
	case ok && f != nil:
		return "served", sent + "; no answer, and a probe on the stream was answered"
	case ok:
		return endOutcome(err), sent + "; no answer, then the stream ended: " + describe(err)
	}
	return "silent", sent + "; neither an answer nor a probe's answer"
}

// probe reports whether the stream still serves after an answered attack.
func (p *peer) probe(ctx context.Context, c *conn) string {
	probeID := uint64(1<<63 + 2)
	if _, err := c.sendAll(&wire.Frame{Kind: wire.FrameRequest, ID: probeID, Method: probeMethod}); err != nil {
		return "; probe not sent: " + describe(err)
	}
	f, err, ok := c.await(ctx, p.window, probeID)
	switch {
	case ok && f != nil:
		return "; the stream still serves"
	case ok:
		return "; then the stream ended: " + describe(err)
	}
	return "; a probe got no answer"
}

// endOutcome classifies why a stream ended.
func endOutcome(err error) string {
	if errors.Is(err, shmtransport.ErrRefused) || errors.Is(err, errShmRefused) || errors.Is(err, tcptransport.ErrRefused) {
		return "unauthenticated"
	}
	if c := status.Code(err); c == codes.Unauthenticated || c == codes.PermissionDenied {
		return "unauthenticated"
	}
	return "dropped"
}

// streamStatus is err, or, when a send saw io.EOF, the status the worker ended the stream
// with: gRPC reports it only to RecvMsg (a worker that refuses a stream without the token may
// do so before the first send).
func streamStatus(rs grpc.ClientStream, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	var f wire.Frame
	if recvErr := rs.RecvMsg(&f); recvErr != nil {
		return recvErr
	}
	return err
}

func describe(err error) string {
	switch {
	case err == nil:
		return "no error"
	case errors.Is(err, io.EOF):
		return "EOF (the worker ended the stream)"
	}
	if s, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", s.Code(), truncate(s.Message(), 200))
	}
	return truncate(err.Error(), 200)
}

// withStream opens a stream with a hello, sends frames, and reports the worker's reaction to
// request id (0: none expected).
func (p *peer) withStream(ctx context.Context, id uint64, frames ...*wire.Frame) (string, string) {
	c, err := p.open(ctx, p.hello())
	if err != nil {
		return dialOutcome(err)
	}
	defer c.s.Close()
	n, err := c.sendAll(frames...)
	sent := fmt.Sprintf("sent %d/%d frames", n, len(frames))
	if err != nil {
		sent += " (send failed: " + describe(err) + ")"
	}
	return p.react(ctx, c, id, sent)
}

func dialOutcome(err error) (string, string) {
	if o := endOutcome(err); o == "unauthenticated" {
		return o, describe(err)
	}
	return "dial-failed", describe(err)
}

// halfOpen leaves three streams open until the program ends: one that never says hello, one
// that announces a chunked message and sends only part of it, and one (over a raw gRPC
// client) that does the same and then closes its sending side.
func (p *peer) halfOpen(ctx context.Context) (string, string) {
	s, err := p.tr.Dial(ctx, p.addr)
	if err != nil {
		return dialOutcome(err)
	}
	p.keep(func() { s.Close() })
	partial := []*wire.Frame{
		p.hello(),
		{Kind: wire.FrameRequest, ID: 1, Method: probeMethod, Sizes: []int64{2 * mib}},
		{Kind: wire.FrameChunk, ID: 1, Payload: make([]byte, mib)},
	}
	c, err := p.open(ctx, nil)
	if err != nil {
		return dialOutcome(err)
	}
	p.keep(func() { c.s.Close() })
	n, err := c.sendAll(partial...)
	detail := fmt.Sprintf("one stream without a hello; one with %d/3 frames of a partial message", n)
	if err != nil {
		detail += " (" + describe(err) + ")"
	}
	// A stream is opened before the worker has seen its headers: give a refusal (no token)
	// time to arrive, so it is reported as such rather than as a stream held.
	select {
	case <-c.done:
		return endOutcome(c.err), detail + "; the worker ended it: " + describe(c.err)
	case <-time.After(p.window / 4):
	}
	if p.shm {
		return "held", detail + p.cutShortFrame(ctx)
	}
	if p.tcp {
		return "held", detail + p.tcpHalfClosed(ctx, partial)
	}
	rs, closeRaw, err := p.rawStream(ctx, 16*mib)
	if err != nil {
		return "held", detail + "; raw stream not opened: " + describe(err)
	}
	p.keep(closeRaw)
	for _, f := range partial {
		if err = rs.SendMsg(f); err != nil {
			break
		}
	}
	if err == nil {
		err = rs.CloseSend()
	}
	detail += "; one half-closed after a partial message"
	if err != nil {
		detail += " (" + describe(err) + ")"
	}
	return "held", detail
}

func (p *peer) keep(closeFn func()) {
	p.mu.Lock()
	p.kept = append(p.kept, closeFn)
	p.mu.Unlock()
}

// nearLimitSizes splits a message of just under the default 4 GiB limit into four buffers.
func nearLimitSizes() []int64 {
	total := int64(core.DefaultMaxMessageSize - 1)
	q := total / 4
	return []int64{q, q, q, total - 3*q}
}

// nearLimit announces, on one stream, 1,000 messages of just under the size limit and sends
// none of their chunks: a worker that allocated what is announced would need 4 TiB.
func (p *peer) nearLimit(ctx context.Context) (string, string) {
	frames := make([]*wire.Frame, 0, 1000)
	for id := uint64(1); id <= 1000; id++ {
		frames = append(frames, &wire.Frame{Kind: wire.FrameRequest, ID: id, Method: probeMethod, Sizes: nearLimitSizes()})
	}
	return p.withStream(ctx, 1, frames...)
}

// wrappingSizes announces sizes whose sum wraps past int64, then sends a chunk of it.
func (p *peer) wrappingSizes(ctx context.Context) (string, string) {
	return p.withStream(ctx, 1,
		&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: probeMethod, Sizes: []int64{1, math.MaxInt64, math.MaxInt64, 2}},
		&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: []byte{1}},
	)
}

// unknownChunk sends chunks of a message never announced.
func (p *peer) unknownChunk(ctx context.Context) (string, string) {
	return p.withStream(ctx, 4242,
		&wire.Frame{Kind: wire.FrameChunk, ID: 4242, Payload: []byte{1, 2, 3}},
		&wire.Frame{Kind: wire.FrameChunk, ID: 4242, Offset: 3, Payload: []byte{4}},
	)
}

// outOfOrderChunks sends a 3 MiB message's chunks last first: an honest reordering the worker
// must reassemble (it answers ReplyNoHandler for the probe method), then a chunk too many.
func (p *peer) outOfOrderChunks(ctx context.Context) (string, string) {
	chunk := make([]byte, mib)
	return p.withStream(ctx, 1,
		&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: probeMethod, Sizes: []int64{mib, 2 * mib}},
		&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: 2 * mib, Payload: chunk},
		&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: 0, Payload: chunk},
		&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: mib, Payload: chunk},
	)
}

// badChunk announces a 64-byte message and sends a chunk of it at offset, which lies outside.
func (p *peer) badChunk(ctx context.Context, offset int64) (string, string) {
	return p.withStream(ctx, 1,
		&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: probeMethod, Sizes: []int64{64}},
		&wire.Frame{Kind: wire.FrameChunk, ID: 1, Offset: offset, Payload: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
	)
}

// headerFlood announces 10,000 messages of 1 MiB each on one stream and sends no chunk.
func (p *peer) headerFlood(ctx context.Context) (string, string) {
	frames := make([]*wire.Frame, 0, 10000)
	for id := uint64(1); id <= 10000; id++ {
		frames = append(frames, &wire.Frame{Kind: wire.FrameRequest, ID: id, Method: probeMethod, Sizes: []int64{mib}})
	}
	return p.withStream(ctx, 1, frames...)
}

// unknownKinds sends frames of kinds no agent sends, one of them announcing a chunked body
// that then arrives, and a response frame a caller never sends to a callee.
func (p *peer) unknownKinds(ctx context.Context) (string, string) {
	return p.withStream(ctx, 0,
		&wire.Frame{Kind: 0, ID: 1, Method: "x", Payload: []byte("zero")},
		&wire.Frame{Kind: 7, ID: 2, Payload: []byte("seven")},
		&wire.Frame{Kind: 255, ID: 3, Buffers: [][]byte{{1}, {2}}},
		&wire.Frame{Kind: 200, ID: 4, Sizes: []int64{16}},
		&wire.Frame{Kind: wire.FrameChunk, ID: 4, Payload: make([]byte, 16)},
		&wire.Frame{Kind: wire.FrameResponse, ID: 5, Status: 250, Error: "not asked"},
		&wire.Frame{Kind: wire.FrameHello, ID: 6, Payload: []byte{0xc1}},
	)
}

// negativeSize announces a buffer of negative size.
func (p *peer) negativeSize(ctx context.Context) (string, string) {
	return p.withStream(ctx, 1,
		&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: probeMethod, Sizes: []int64{8, -4}},
		&wire.Frame{Kind: wire.FrameChunk, ID: 1, Payload: []byte{1, 2, 3, 4}},
	)
}

// releaseOtherHolder releases forks another worker holds, adds a fork for a holder that does
// not exist, and sends an operation of an unknown kind. None may change the owner's table;
// the worker logs the refusal and goes on serving.
func (p *peer) releaseOtherHolder(ctx context.Context) (string, string) {
	other := (p.rank + 1) % 3
	var ops []wire.RefOp
	for local := int64(0); local < 64; local++ {
		ops = append(ops, wire.RefOp{Kind: wire.RefRelease, RRef: wire.RRefID{Creator: 0, Local: local}, Fork: wire.ForkID{Creator: other, Local: local}, Holder: other})
	}
	ops = append(ops,
		wire.RefOp{Kind: wire.RefAdd, RRef: wire.RRefID{Creator: 0, Local: 1}, Fork: wire.ForkID{Creator: p.rank, Local: 1 << 40}, Holder: 1 << 40},
		wire.RefOp{Kind: 99, RRef: wire.RRefID{Creator: -1, Local: math.MinInt64}, Holder: -1},
	)
	// Numbered as a worker's first operations, so they reach the checks of what they do, and
	// again far ahead, out of sequence.
	return p.withStream(ctx, 0, &wire.Frame{Kind: wire.FrameRefs, Refs: ops, RefSeq: 1}, &wire.Frame{Kind: wire.FrameRefs, Refs: ops, RefSeq: 1 << 40})
}

// helloMismatch claims a name with a rank that is not its own, then tries a call.
func (p *peer) helloMismatch(ctx context.Context) (string, string) {
	c, err := p.open(ctx, wire.HelloFrame(p.name, p.rank+1, 0))
	if err != nil {
		return dialOutcome(err)
	}
	defer c.s.Close()
	return p.react(ctx, c, 1, fmt.Sprintf("hello %q with rank %d", p.name, p.rank+1))
}

// helloMissing sends a call before any hello.
func (p *peer) helloMissing(ctx context.Context) (string, string) {
	c, err := p.open(ctx, nil)
	if err != nil {
		return dialOutcome(err)
	}
	defer c.s.Close()
	n, _ := c.sendAll(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: probeMethod})
	return p.react(ctx, c, 1, fmt.Sprintf("sent %d request without a hello", n))
}

// hugeMethod sends a request whose method name is 20 MiB. The transport's own client refuses
// to send a frame over the 16 MiB frame limit, so this one goes over a raw gRPC client with a
// larger send limit: the worker's gRPC server must refuse it.
func (p *peer) hugeMethod(ctx context.Context) (string, string) {
	if p.shm { // over shared memory the frame's length comes first: announce 20 MiB
		return p.corruptRing(ctx, func(region []byte) {
			binary.LittleEndian.PutUint32(region[2*rawCtrl:], 20*mib)
			binary.LittleEndian.PutUint64(region[0:], 4)
		})
	}
	if p.tcp {
		return p.tcpHugeMethod(ctx)
	}
	rs, closeRaw, err := p.rawStream(ctx, 64*mib)
	if err != nil {
		return dialOutcome(err)
	}
	defer closeRaw()
	if err := rs.SendMsg(p.hello()); err != nil {
		return endOutcome(streamStatus(rs, err)), "hello not sent: " + describe(err)
	}
	huge := &wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: strings.Repeat("m", 20*mib)}
	sendErr := rs.SendMsg(huge)
	// The answer, or the stream's end, comes on the receiving side.
	got := make(chan error, 1)
	go func() {
		var f wire.Frame
		err := rs.RecvMsg(&f)
		if err == nil {
			err = fmt.Errorf("answered with status %d: %s", f.Status, truncate(f.Error, 200))
		}
		got <- err
	}()
	select {
	case err := <-got:
		detail := "20 MiB method name"
		if sendErr != nil {
			detail += " (send: " + describe(sendErr) + ")"
		}
		if strings.HasPrefix(err.Error(), "answered") {
			return "replied", detail + "; " + err.Error()
		}
		return endOutcome(err), detail + "; " + describe(err)
	case <-time.After(p.window):
		return "silent", "20 MiB method name; no reaction"
	case <-ctx.Done():
		return "silent", "20 MiB method name; no reaction"
	}
}

// budgetHog announces, one stream each, messages of halving sizes from just under the limit
// down to 64 KiB, and sends no chunk: greedily, they reserve all but a sliver of the worker's
// receive budget however large it is. It holds them for -hold, while the test's honest workers
// send big messages to this worker, then reports what became of them.
func (p *peer) budgetHog(ctx context.Context) (string, string) {
	var conns []*conn
	defer func() {
		for _, c := range conns {
			c.s.Close()
		}
	}()
	var announced int64
	for size := int64(core.DefaultMaxMessageSize - 1); size >= 64<<10; size /= 2 {
		c, err := p.open(ctx, p.hello())
		if err != nil {
			if len(conns) == 0 {
				return dialOutcome(err)
			}
			break
		}
		conns = append(conns, c)
		if _, err := c.sendAll(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: probeMethod, Sizes: []int64{size}}); err == nil {
			announced += size
		}
		// In order: each announcement reserves what is left, or waits, before the next.
		time.Sleep(30 * time.Millisecond)
	}
	select {
	case <-time.After(p.hold):
	case <-ctx.Done():
	}
	replied, ended, refused := 0, 0, 0
	for _, c := range conns {
		select {
		case <-c.frames:
			replied++
		case <-c.done:
			ended++
			if endOutcome(c.err) == "unauthenticated" {
				refused++
			}
		default:
		}
	}
	detail := fmt.Sprintf("%d streams announced %.2f GiB without chunks for %s: %d answered, %d ended (%d for want of the token), %d held",
		len(conns), float64(announced)/(1<<30), p.hold, replied, ended, refused, len(conns)-replied-ended)
	switch {
	case refused == len(conns):
		return "unauthenticated", detail
	case replied+ended == len(conns):
		return "dropped", detail
	}
	return "held", detail
}

// rawStream opens an agent stream with a plain gRPC client whose send limit is sendLimit and
// which can half-close: the transport's client allows neither.
func (p *peer) rawStream(ctx context.Context, sendLimit int) (grpc.ClientStream, func(), error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(sendLimit), grpc.MaxCallRecvMsgSize(16*mib)),
	}
	if p.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(p.token)))
	}
	cc, err := grpc.NewClient("passthrough:///"+p.addr, opts...)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	cs, err := cc.NewStream(sctx, &grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}, "/tensorplay.rpc.Agent/Stream")
	if !stop() || err != nil {
		cancel()
		cc.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, nil, err
	}
	return cs, func() { cancel(); cc.Close() }, nil
}

// rawCodec encodes frames with msgpack as the agents' codec does (a Frame encodes itself).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return msgpack.Marshal(v) }
func (rawCodec) Unmarshal(data []byte, v any) error { return msgpack.Unmarshal(data, v) }
func (rawCodec) Name() string                       { return "msgpack" }

// bearer presents a token the way the transport does (core/internal/secure), for the raw
// client.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"tensorplay-token": string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("... (%d bytes)", len(s))
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

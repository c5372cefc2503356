package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Choice is one transport a Chooser may use, with the name that tags its address.
type Choice struct {
	Name      string
	Transport Transport
}

// Reacher is implemented by transports that reach only some addresses, such as those on the
// same host.
type Reacher interface {
	Reaches(addr string) bool
}

// Chooser is a Transport over several: it listens on all of them and dials each peer over the
// first, in the order given, that both sides listen on and that reaches the peer. Its address
// lists every address with its transport's name: "shm=shm://…;grpc=127.0.0.1:4242".
type Chooser struct {
	choices []Choice
}

// NewChooser returns a transport over choices, preferred in that order.
func NewChooser(choices ...Choice) *Chooser { return &Chooser{choices: choices} }

const (
	addrSep = ";"
	nameSep = "="
)

// Listen listens on every transport and returns their tagged addresses.
func (c *Chooser) Listen(host string, serve func(Stream)) (string, error) {
	var addrs []string
	for _, ch := range c.choices {
		addr, err := ch.Transport.Listen(host, serve)
		if err != nil {
			return "", fmt.Errorf("%s transport: %w", ch.Name, err)
		}
		addrs = append(addrs, ch.Name+nameSep+addr)
	}
	return strings.Join(addrs, addrSep), nil
}

// reaching lists, in order of preference, the transports that reach addr, each with its part
// of addr.
func (c *Chooser) reaching(addr string) []reachingChoice {
	var out []reachingChoice
	for _, ch := range c.choices {
		a, ok := ChoiceAddr(addr, ch.Name)
		if !ok {
			continue
		}
		if r, ok := ch.Transport.(Reacher); ok && !r.Reaches(a) {
			continue
		}
		out = append(out, reachingChoice{Choice: ch, addr: a})
	}
	return out
}

type reachingChoice struct {
	Choice
	addr string
}

// Dial opens a stream to the agent at addr over the first transport that reaches it. If that
// fails, the next is tried: a peer that refuses shared memory may still take gRPC.
func (c *Chooser) Dial(ctx context.Context, addr string) (Stream, error) {
	var errs []error
	for _, ch := range c.reaching(addr) {
		s, err := ch.Transport.Dial(ctx, ch.addr)
		if err == nil {
			return s, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", ch.Name, err))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no transport of this worker (%s) reaches %s", c.names(), addr)
	}
	return nil, errors.Join(errs...)
}

// Probe implements Prober over the transports that reach addr, in order: the first that can
// tell whether the worker is there or gone says so.
func (c *Chooser) Probe(ctx context.Context, addr string) error {
	err := fmt.Errorf("no transport of this worker (%s) can probe %s", c.names(), addr)
	for _, ch := range c.reaching(addr) {
		p, ok := ch.Transport.(Prober)
		if !ok {
			continue
		}
		err = p.Probe(ctx, ch.addr)
		if err == nil || errors.Is(err, ErrGone) {
			return err
		}
	}
	return err
}

func (c *Chooser) names() string {
	var names []string
	for _, ch := range c.choices {
		names = append(names, ch.Name)
	}
	return strings.Join(names, ", ")
}

// ListenStopper is implemented by transports that can stop accepting streams before Close
// breaks the ones open.
type ListenStopper interface {
	StopListening()
}

// Close stops every transport listening, then closes them all: a peer that sees a stream of
// this worker end and probes whether it is gone (to drop the RRef forks it held) must not
// find it still listening on another transport.
func (c *Chooser) Close() error {
	for _, ch := range c.choices {
		if s, ok := ch.Transport.(ListenStopper); ok {
			s.StopListening()
		}
	}
	var errs []error
	for _, ch := range c.choices {
		errs = append(errs, ch.Transport.Close())
	}
	return errors.Join(errs...)
}

// ChoiceAddr is the address of the transport named name in a Chooser's address.
func ChoiceAddr(addr, name string) (string, bool) {
	for _, part := range strings.Split(addr, addrSep) {
		if n, a, ok := strings.Cut(part, nameSep); ok && n == name {
			return a, true
		}
	}
	return "", false
}

// NetworkAddr is the host:port in addr, which may be a Chooser's address; addr itself if it
// has none.
func NetworkAddr(addr string) string {
	for _, part := range strings.Split(addr, addrSep) {
		_, a, _ := strings.Cut(part, nameSep)
		if _, port, err := net.SplitHostPort(a); err == nil {
			if _, err := strconv.ParseUint(port, 10, 16); err == nil {
				return a
			}
		}
	}
	return addr
}

package transport

import (
	"sync/atomic"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// Fault is a rule on the frames an InmemNetwork carries.
type Fault struct {
	// From and To select frames sent by and to the transports listening at these addresses
	// ("" matches any).
	From, To string
	// Match, if set, selects among those frames.
	Match func(*wire.Frame) bool
	// Drop loses each selected frame while its stream stays up, as a link does with what it
	// carries just before its connection is seen to break.
	Drop bool
	// Delay holds each selected frame this long; later frames of its lane wait behind it (a
	// lane keeps its order) while frames of the other lane go by.
	Delay time.Duration
	// Hold, if not nil, holds each selected frame until it is closed, as Delay does.
	Hold <-chan struct{}
	// Duplicate delivers each selected frame twice, one copy right behind the other, as a
	// link that retransmits what it already delivered would.
	Duplicate bool
}

// Injected is a fault in force.
type Injected struct {
	Fault
	net  *InmemNetwork
	hits atomic.Int64
}

// Hits is the number of frames the fault has applied to.
func (i *Injected) Hits() int64 { return i.hits.Load() }

// Remove ends the fault for frames sent from now on.
func (i *Injected) Remove() {
	i.net.mu.Lock()
	defer i.net.mu.Unlock()
	for k, f := range i.net.faults {
		if f == i {
			i.net.faults = append(i.net.faults[:k], i.net.faults[k+1:]...)
			return
		}
	}
}

// Inject puts f in force for frames sent from now on.
func (n *InmemNetwork) Inject(f Fault) *Injected {
	i := &Injected{Fault: f, net: n}
	n.mu.Lock()
	n.faults = append(n.faults, i)
	n.mu.Unlock()
	return i
}

// Partition cuts the link between the transports listening at a and b: the streams between
// them break, and dials and probes from one to the other fail with ErrUnreachable until Heal.
func (n *InmemNetwork) Partition(a, b string) {
	n.mu.Lock()
	n.cut[linkKey(a, b)] = true
	n.mu.Unlock()
	n.Break(a, b)
}

// Break ends the streams between the transports listening at a and b, as a reset connection
// does; new ones can be opened at once.
func (n *InmemNetwork) Break(a, b string) {
	n.mu.Lock()
	var broken []*inmemStream
	for _, t := range n.listeners {
		t.mu.Lock()
		for s := range t.streams {
			if linkKey(s.local, s.remote) == linkKey(a, b) {
				broken = append(broken, s)
			}
		}
		t.mu.Unlock()
	}
	n.mu.Unlock()
	for _, s := range broken {
		s.Close()
	}
}

// Heal restores the link between a and b.
func (n *InmemNetwork) Heal(a, b string) {
	n.mu.Lock()
	delete(n.cut, linkKey(a, b))
	n.mu.Unlock()
}

func linkKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// fate is what the faults in force do to f, sent from one address to another.
func (n *InmemNetwork) fate(from, to string, f *wire.Frame) (drop bool, delay time.Duration, holds []<-chan struct{}, duplicate bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, i := range n.faults {
		if (i.From != "" && i.From != from) || (i.To != "" && i.To != to) || (i.Match != nil && !i.Match(f)) {
			continue
		}
		i.hits.Add(1)
		drop = drop || i.Drop
		delay = max(delay, i.Delay)
		if i.Hold != nil {
			holds = append(holds, i.Hold)
		}
		duplicate = duplicate || i.Duplicate
	}
	return drop, delay, holds, duplicate
}

package core

import (
	"fmt"
	"net"
	"slices"
)

// PeerIdentity is what a transport knows of who opened a stream it accepted.
type PeerIdentity struct {
	// Addr is where the stream came from: "host:port" for network transports, the address
	// the dialing transport listens on for the in-memory one; "" if unknown.
	Addr string
	// Names are the names the peer's TLS certificate carries (common name and DNS names).
	Names []string
}

// IdentifiedStream is implemented by accepted streams whose transport knows who opened them.
type IdentifiedStream interface {
	Identity() PeerIdentity
}

// checkIdentity verifies that the peer that opened s may speak as worker, as its hello says:
// a certificate that names a worker of this world must name this one, and the stream must
// come from the host the worker registered at the rendezvous. A peer can thus act only as
// itself (or, without TLS, as a worker on its own host).
func (a *Agent) checkIdentity(s Stream, worker WorkerInfo) error {
	is, ok := s.(IdentifiedStream)
	if !ok {
		return nil
	}
	id := is.Identity()
	namesWorker := false
	for _, n := range id.Names {
		if _, ok := a.byName[n]; ok {
			namesWorker = true
		}
	}
	if namesWorker && !slices.Contains(id.Names, worker.Name) {
		return fmt.Errorf("a peer whose certificate names %v said it was worker %q", id.Names, worker.Name)
	}
	if !sameHost(id.Addr, worker.Addr) {
		return fmt.Errorf("a peer at %s said it was worker %q, registered at %s", id.Addr, worker.Name, worker.Addr)
	}
	return nil
}

// sameHost reports whether a stream from "from" may belong to a worker registered at
// "registered": their IP addresses are equal (a worker dials from the address it listens
// on), or, for addresses that are not IP:port, the two are equal. Unknown or unspecified
// addresses prove nothing and pass.
func sameHost(from, registered string) bool {
	if from == "" || registered == "" {
		return true
	}
	fromHost, _, err1 := net.SplitHostPort(from)
	regHost, _, err2 := net.SplitHostPort(registered)
	if err1 != nil || err2 != nil {
		return from == registered
	}
	fromIP, regIP := net.ParseIP(fromHost), net.ParseIP(regHost)
	if fromIP == nil || regIP == nil {
		return fromHost == regHost
	}
	return regIP.IsUnspecified() || fromIP.Equal(regIP)
}

// streamOrigin names where s came from, for logs.
func streamOrigin(s Stream) string {
	if is, ok := s.(IdentifiedStream); ok && is.Identity().Addr != "" {
		return is.Identity().Addr
	}
	return "an unknown address"
}

package core

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
)

// checkIdentity verifies that the peer that opened s may speak as worker, as its hello says:
// a certificate that names a worker of this world must name this one, and the stream must
// come from the host the worker registered at the rendezvous (for a shared-memory stream: the
// worker registered a shared-memory address on this host). A peer can thus act only as
// itself (or, without TLS, as a worker on its own host).
func (a *Agent) checkIdentity(s transport.Stream, worker WorkerInfo) error {
	is, ok := s.(transport.IdentifiedStream)
	if !ok {
		return nil
	}
	id := is.Identity()
	namesWorker := false
	for _, n := range id.Names {
		if _, ok := a.world().byName[n]; ok {
			namesWorker = true
		}
	}
	if namesWorker && !slices.Contains(id.Names, worker.Name) {
		return fmt.Errorf("a peer whose certificate names %v said it was worker %q", id.Names, worker.Name)
	}
	if id.HostAddrPrefix != "" && !strings.Contains(worker.Addr, id.HostAddrPrefix) {
		return fmt.Errorf("a peer on this host said it was worker %q, which registered no shared-memory address here (%s)", worker.Name, worker.Addr)
	}
	if !sameHost(id.Addr, transport.NetworkAddr(worker.Addr)) {
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
func streamOrigin(s transport.Stream) string {
	if is, ok := s.(transport.IdentifiedStream); ok && is.Identity().Addr != "" {
		return is.Identity().Addr
	}
	return "an unknown address"
}

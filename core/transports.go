package core

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tensorplay/tensorplay-rpc/core/transport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/grpctransport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/shmtransport"
	"github.com/tensorplay/tensorplay-rpc/core/transport/tcptransport"
)

// TransportsEnv names the environment variable that picks transports (comma-separated, in
// order of preference) when Config.Transports is empty, e.g. "tcp" to pin the path between
// hosts, or "grpc".
const TransportsEnv = "TENSORPLAY_RPC_TRANSPORTS"

// Transport names.
const (
	// TransportSHM carries calls through shared memory, to workers on the same host.
	TransportSHM = "shm"
	// TransportTCP carries calls over plain TCP, to any worker: the path between hosts.
	TransportTCP = "tcp"
	// TransportGRPC carries calls over gRPC, to any worker; a world's workers listen on it
	// too, so one pinned to it reaches the others.
	TransportGRPC = "grpc"
)

// DefaultTransports is shared memory to workers on this host, plain TCP to the others, and
// gRPC to those that name only it.
var DefaultTransports = []string{TransportSHM, TransportTCP, TransportGRPC}

// transportNames are the transports there are, in the order errors list them.
var transportNames = []string{TransportSHM, TransportTCP, TransportGRPC}

// ParseTransports reads a comma-separated list of transport names.
func ParseTransports(s string) ([]string, error) {
	var names []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names, checkTransports(names)
}

func checkTransports(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("no transport named: want some of %q", transportNames)
	}
	for i, n := range names {
		if !slices.Contains(transportNames, n) {
			return fmt.Errorf("unknown transport %q: want one of %q", n, transportNames)
		}
		if slices.Contains(names[:i], n) {
			return fmt.Errorf("transport %q named twice", n)
		}
	}
	return nil
}

// newTransport builds the transports cfg names (see Config.Transports), preferred in order.
func newTransport(cfg Config, getenv func(string) string) (transport.Transport, error) {
	names := cfg.Transports
	if len(names) == 0 {
		if env := getenv(TransportsEnv); env != "" {
			var err error
			if names, err = ParseTransports(env); err != nil {
				return nil, fmt.Errorf("%s=%q: %w", TransportsEnv, env, err)
			}
		}
	}
	if len(names) == 0 {
		names = DefaultTransports
		if cfg.TLS != nil && cfg.Token == "" {
			// Shared memory admits a process of this user that shows the token; without one,
			// it would not hold a peer to what a certificate holds it to over the network.
			names = []string{TransportTCP, TransportGRPC}
		}
	}
	if err := checkTransports(names); err != nil {
		return nil, err
	}
	if cfg.TLS != nil && cfg.Token == "" && slices.Contains(names, TransportSHM) {
		return nil, fmt.Errorf("the %q transport needs a token in a world under TLS: set one, or name only %q or %q", TransportSHM, TransportTCP, TransportGRPC)
	}
	var choices []transport.Choice
	for _, n := range names {
		var t transport.Transport
		var err error
		switch n {
		case TransportSHM:
			var m *shmtransport.Transport
			if m, err = shmtransport.New(cfg.Token, 0); err == nil {
				m.SetPeerTimeout(cfg.PeerTimeout)
				t = m
			}
		case TransportTCP:
			var p *tcptransport.Transport
			if p, err = tcptransport.New(cfg.Token, cfg.TLS); err == nil {
				p.SetPeerTimeout(cfg.PeerTimeout)
				t = p
			}
		case TransportGRPC:
			var g *grpctransport.Transport
			if g, err = grpctransport.New(cfg.Token, cfg.TLS); err == nil {
				g.SetPeerTimeout(cfg.PeerTimeout)
				t = g
			}
		}
		if err != nil {
			for _, c := range choices {
				c.Transport.Close()
			}
			return nil, fmt.Errorf("%s transport: %w", n, err)
		}
		choices = append(choices, transport.Choice{Name: n, Transport: t})
	}
	return transport.NewChooser(choices...), nil
}

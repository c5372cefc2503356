package core

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// StoreAddress returns the "host:port" of the rendezvous store named by an init method:
// "env://" reads MASTER_ADDR and MASTER_PORT through getenv, "tcp://host:port" names it.
func StoreAddress(initMethod string, getenv func(string) string) (string, error) {
	u, err := url.Parse(initMethod)
	if err != nil {
		return "", fmt.Errorf("init_method %q is not a URL: %w", initMethod, err)
	}
	switch u.Scheme {
	case "env":
		host, port := getenv("MASTER_ADDR"), getenv("MASTER_PORT")
		if host == "" {
			return "", fmt.Errorf("init_method env:// needs the environment variable MASTER_ADDR, but it is not set")
		}
		if port == "" {
			return "", fmt.Errorf("init_method env:// needs the environment variable MASTER_PORT, but it is not set")
		}
		return checkHostPort(net.JoinHostPort(host, port), "MASTER_ADDR/MASTER_PORT")
	case "tcp":
		return checkHostPort(u.Host, initMethod)
	default:
		return "", fmt.Errorf("init_method %q is not supported: use env:// or tcp://host:port", initMethod)
	}
}

func checkHostPort(hostport, from string) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || host == "" {
		return "", fmt.Errorf("store address %q from %s must be host:port", hostport, from)
	}
	var p int
	if _, err := fmt.Sscanf(port, "%d", &p); err != nil || p < 1 || p > 65535 || fmt.Sprint(p) != port {
		return "", fmt.Errorf("store port %q from %s must be a number from 1 to 65535", port, from)
	}
	return hostport, nil
}

// hostToward returns the local IP address this machine uses to reach addr, so a worker
// listens on, and advertises, the interface its peers can reach.
func hostToward(addr string) (string, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "", fmt.Errorf("find the local address toward %s: %w", addr, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// join publishes self in the store and returns every worker of the world, indexed by id.
func join(ctx context.Context, store Store, self WorkerInfo, worldSize int, wait time.Duration) ([]WorkerInfo, error) {
	value, err := msgpack.Marshal(&self)
	if err != nil {
		return nil, err
	}
	values, err := store.Gather(ctx, GatherRequest{
		Round: "join", Rank: self.ID, Size: worldSize, Who: fmt.Sprintf("%q", self.Name), Value: value, WaitMs: wait.Milliseconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRendezvous, err)
	}
	workers := make([]WorkerInfo, worldSize)
	byName := map[string]int{}
	for rank, v := range values {
		if err := msgpack.Unmarshal(v, &workers[rank]); err != nil {
			return nil, fmt.Errorf("%w: rank %d sent a bad worker record: %w", ErrRendezvous, rank, err)
		}
		w := workers[rank]
		if other, dup := byName[w.Name]; dup {
			return nil, fmt.Errorf("%w: duplicate worker name %q (ranks %d and %d)", ErrRendezvous, w.Name, other, rank)
		}
		byName[w.Name] = rank
	}
	return workers, nil
}

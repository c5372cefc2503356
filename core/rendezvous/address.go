package rendezvous

import (
	"fmt"
	"net"
	"net/url"
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
	// Port 0 asks rank 0 for a free port (see Config.StoreServed); the others are refused it
	// when they dial.
	if _, err := fmt.Sscanf(port, "%d", &p); err != nil || p < 0 || p > 65535 || fmt.Sprint(p) != port {
		return "", fmt.Errorf("store port %q from %s must be a number from 0 to 65535", port, from)
	}
	return hostport, nil
}

// HostToward returns the local IP address this machine uses to reach addr, so a worker
// listens on, and advertises, the interface its peers can reach.
func HostToward(addr string) (string, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "", fmt.Errorf("find the local address toward %s: %w", addr, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

package core

import (
	"fmt"
	"strconv"
	"time"
)

// DefaultPeerTimeout bounds how long a peer that stopped answering without closing its
// connections (a cut link, a host gone silent) keeps the calls waiting on it: then its streams
// break and the calls fail naming it. A killed process is noticed at once, when its host
// closes its connections; a peer that is only slow or paused for less than this loses nothing.
const DefaultPeerTimeout = 30 * time.Second

// MinPeerTimeout is the shortest peer timeout: gRPC-Go pings a silent server at most every
// 10 s, and the ping's answer needs time to come.
const MinPeerTimeout = 11 * time.Second

// peerTimeoutEnv names the environment variable that sets the peer timeout, in seconds, of
// workers whose Config leaves it 0 (Python workers among them).
const peerTimeoutEnv = "TENSORPLAY_RPC_PEER_TIMEOUT"

// resolvePeerTimeout returns the configured peer timeout, else the environment's, else the
// default; it refuses one gRPC cannot keep.
func resolvePeerTimeout(configured time.Duration, getenv func(string) string) (time.Duration, error) {
	d := configured
	if d == 0 {
		if v := getenv(peerTimeoutEnv); v != "" {
			secs, err := strconv.ParseFloat(v, 64)
			if err != nil || secs <= 0 || secs > 1e9 {
				return 0, fmt.Errorf("%s=%q: want a positive number of seconds", peerTimeoutEnv, v)
			}
			d = time.Duration(secs * float64(time.Second))
		}
	}
	if d == 0 {
		return DefaultPeerTimeout, nil
	}
	if d < MinPeerTimeout {
		return 0, fmt.Errorf("peer timeout %v is shorter than %v, the shortest gRPC's pings can keep", d, MinPeerTimeout)
	}
	return d, nil
}

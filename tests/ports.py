"""Loopback ports for test worlds, shared by the pytest fixtures (conftest) and the scripts the
tests start (the differential harness), which run without pytest."""

import random
import socket


def free_port() -> int:
    """A loopback TCP port that was free a moment ago.

    Drawn from below the kernel's ephemeral range: a port the kernel handed out for port 0
    could be handed out again (to another listener or an outgoing connection) before the
    world binds it.
    """
    first = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    lowest = 10000
    for _ in range(200):
        port = random.randrange(lowest, max(first, lowest + 1000))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in [{lowest}, {first}) after 200 tries")

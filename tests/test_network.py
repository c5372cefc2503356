"""Workers on two "hosts": network namespaces joined by a veth pair (tests run as root), so a
test can cut the link between them as a network would, and restore it."""

import os
import subprocess
import time

import pytest

from conftest import expect_behaviours, start_world

# A short peer timeout, so the cut is noticed in seconds; the README documents the default.
PEER_TIMEOUT_S = 12


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Namespaces A (10.77.0.1) and B (10.77.0.2) on one veth pair; removed afterwards."""
    tag = f"tp{os.getpid() % 100000}"
    a, b, va, vb = f"{tag}a", f"{tag}b", f"{tag}va", f"{tag}vb"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        _ip("-n", a, "addr", "add", "10.77.0.1/24", "dev", va)
        _ip("-n", b, "addr", "add", "10.77.0.2/24", "dev", vb)
        for ns, dev in ((a, va), (b, vb)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
        yield {"a": a, "b": b, "link_b": vb}
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.mark.timeout(240)
def test_a_cut_link_fails_calls_within_the_bound_and_heals(two_hosts, tmp_path, world):
    ready, cut, healed = (str(tmp_path / n) for n in ("ready", "cut", "healed"))
    ns_a, ns_b = two_hosts["a"], two_hosts["b"]
    w = world(
        "network:link_cut", 3, args=[ready, cut, healed],
        env={"MASTER_ADDR": "10.77.0.1", "TENSORPLAY_RPC_PEER_TIMEOUT": str(PEER_TIMEOUT_S), "TENSORPLAY_RPC_TRANSPORTS": ""},
        launch_prefix={0: ["ip", "netns", "exec", ns_a], 1: ["ip", "netns", "exec", ns_b], 2: ["ip", "netns", "exec", ns_a]},
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(ready) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in w.procs), "a worker ended before the cut"
        time.sleep(0.05)
    assert os.path.exists(ready), "the world never got going"
    _ip("-n", ns_b, "link", "set", two_hosts["link_b"], "down")
    cut_at = time.monotonic()
    open(cut, "w").close()
    deadline = cut_at + PEER_TIMEOUT_S + 30
    while not os.path.exists(cut + ".seen") and time.monotonic() < deadline:
        time.sleep(0.1)
    # Down for longer than the peer timeout: both sides see their streams end during the cut,
    # and worker1 must not take worker0 for gone (it would drop the RRef worker0 holds).
    time.sleep(max(0.0, cut_at + PEER_TIMEOUT_S + 4 - time.monotonic()))
    _ip("-n", ns_b, "link", "set", two_hosts["link_b"], "up")
    open(healed, "w").close()
    results = w.finish(timeout=120)
    for r in results:
        assert r.returncode == 0, r.output
    expect_behaviours(results[0].value, {
        "an RRef owned across the link resolves before the cut": lambda o: o["before"] == 42,
        "a worker on this side of the cut keeps answering": lambda o: o["survivor"] == 4,
        "a call across the cut fails naming the worker behind it": lambda o: '"worker1"' in o["cut_call"],
        "that call fails within the peer timeout (keepalive noticed the silent loss)":
            lambda o: o["cut_call_failed_after"] < PEER_TIMEOUT_S + 4,
        "calls across the link succeed once it is back": lambda o: o["after_heal"] == 7,
        # RRefs owned across the cut were neither freed early (both still resolve) nor leaked.
        "RRefs owned across the cut were not freed early": lambda o: o["theirs_after"] == 42 and o["held_after"] == 2,
        "and were not leaked once released": lambda o: o["owned_here"] == (0, 0) and o["owned_there"] == (0, 0),
    })


def _listening_addresses(ns: str, pid: int) -> list:
    """The local addresses of the TCP sockets process pid listens on, in namespace ns."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnpH"], check=True, capture_output=True, text=True, timeout=30).stdout
    return sorted(line.split()[3] for line in out.splitlines() if f"pid={pid}," in line)


@pytest.mark.timeout(120)
def test_workers_listen_only_on_the_interface_that_routes_to_the_master(two_hosts, tmp_path, world):
    ns_a = two_hosts["a"]
    # Another interface in the namespace, which the worker must not listen on.
    _ip("-n", ns_a, "link", "add", "other0", "type", "veth", "peer", "name", "other1")
    _ip("-n", ns_a, "addr", "add", "10.88.0.1/24", "dev", "other0")
    _ip("-n", ns_a, "link", "set", "other0", "up")
    ready, done = str(tmp_path / "ready"), str(tmp_path / "done")
    w = world("network:listen_and_wait", 1, args=[ready, done], env={"MASTER_ADDR": "10.77.0.1"},
              launch_prefix={0: ["ip", "netns", "exec", ns_a]})
    deadline = time.monotonic() + 60
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(ready), "the worker never joined"
    addresses = _listening_addresses(ns_a, w.procs[0].pid)
    open(done, "w").close()
    results = w.finish(timeout=60)
    assert results[0].returncode == 0, results[0].output
    # The store (rank 0 hosts it) and the worker, both on the address that routes to MASTER_ADDR.
    assert addresses and all(a.startswith("10.77.0.1:") for a in addresses), addresses

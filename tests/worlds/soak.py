"""A soak: every worker calls every other with a mix of calls, payloads and RRefs, with small
random delays, then checks that nothing leaked."""

import gc
import random
import threading
import time

import numpy as np

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent
from tensorplay_rpc import api as rpc_api

from .common import add, init, rss_kib, wait_until
from .rrefs import Counter


def nbytes(x):
    return x.nbytes


def snapshot():
    agent = _agent.require_agent()
    gc.collect()
    return {
        "pending_futures": agent.pending_futures(),
        "lent": agent.lent_messages(),
        "goroutines": agent.goroutines(),
        # Callback threads come and go with the work (an idle one ends after a while): counted
        # apart, and bounded, not compared.
        "threads": sum(not t.name.startswith("tensorplay-rpc-callbacks-") for t in threading.enumerate()),
        "callback_threads": sum(t.name.startswith("tensorplay-rpc-callbacks-") for t in threading.enumerate()),
        "rss_kib": rss_kib(),
    }


def run(rank, world_size, seconds, doomed_ready=""):
    """The soak. With doomed_ready, the last rank writes that file once it is busy and the test
    SIGKILLs it midway; the others go on with the rest, expecting errors that name it from
    calls to it, and end with nothing leaked."""
    init(rank, world_size, rpc_timeout=60)
    rng = random.Random(rank)
    peers = [f"worker{i}" for i in range(world_size)]
    for peer in peers:  # every connection made before counting what is alive
        rpc.rpc_sync(peer, add, args=(rank, 0))
        rpc.rpc_async(peer, nbytes, args=(np.zeros(2 << 20, dtype=np.uint8),)).wait()
        rpc.remote(peer, Counter).to_here()
    rpc_api._barrier(set(peers))
    warm = snapshot()
    doomed = f"worker{world_size - 1}" if doomed_ready else None
    if doomed and rank == world_size - 1:
        with open(doomed_ready, "w") as f:
            f.write("busy")
        seconds = float(seconds) * 10  # killed long before the end
    lost = 0

    def lost_to_the_dead(err, peer):
        """A call that failed because the doomed worker died: it must say so; then no more
        calls go to it."""
        nonlocal lost
        if peer != doomed or f'"{doomed}"' not in str(err):
            raise err
        lost += 1
        if peer in peers:
            peers.remove(peer)

    deadline = time.monotonic() + float(seconds)
    halfway = time.monotonic() + float(seconds) / 2
    middle = None
    inflight, done, checked, rref = [], 0, 0, None
    while time.monotonic() < deadline:
        if middle is None and time.monotonic() > halfway:
            middle = snapshot()
        peer = rng.choice(peers)
        action = rng.random()
        try:
            if action < 0.45:
                size = rng.choice([0, 100, 5000, 1 << 20, 3 << 20])
                arr = np.full(size, rank, dtype=np.uint8)
                inflight.append((rpc.rpc_async(peer, nbytes, args=(arr,)), size, peer))
            elif action < 0.65:
                assert rpc.rpc_sync(peer, add, args=(rank, 1)) == rank + 1
                done += 1
            elif action < 0.85:
                rref = rpc.remote(peer, Counter, args=(rank,))
                if rng.random() < 0.5:
                    assert rref.to_here().count == rank
                del rref
            else:
                rref = rpc.remote(peer, Counter, args=(rank,))
                assert rref.rpc_sync().increment(2) == rank + 2
        except RuntimeError as err:
            lost_to_the_dead(err, peer)
        if len(inflight) >= 32:
            checked += settle(inflight, lost_to_the_dead)
        if rng.random() < 0.1:
            time.sleep(rng.random() / 200)
    checked += settle(inflight, lost_to_the_dead)
    rref = None  # the last one made is no longer referenced either
    if doomed in peers:
        peers.remove(doomed)
    rpc_api._barrier(set(peers))
    owned_empty = wait_until(lambda: rpc_api._owned_rref_count() == (0, 0), timeout=20)
    owned = rpc_api._owned_rref_count()
    rpc_api._barrier(set(peers))
    # A future that was waited for leaves the agent's table when the event thread takes its
    # completion event, which may still be queued here: read the table once it has drained
    # (a leak never drains and still fails the check).
    wait_until(lambda: _agent.require_agent().pending_futures() == 0, timeout=10)
    end = snapshot()
    rpc.shutdown()
    return {"warm": warm, "middle": middle, "end": end, "owned_empty": owned_empty, "owned": owned, "calls": done + checked, "lost": lost}


def settle(inflight, on_error):
    """Wait for the calls in flight; returns how many completed."""
    completed = 0
    for fut, size, peer in inflight:
        try:
            assert fut.wait() == size
            completed += 1
        except RuntimeError as err:
            on_error(err, peer)
    inflight.clear()
    return completed

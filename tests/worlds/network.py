"""A world spread over two network namespaces joined by a veth pair, whose link the test cuts
and restores."""

import gc
import time

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent

from .common import add, error_of, init, set_done, wait_done, wait_for_file, wait_until

_held = None


def hold(rref):
    """Runs on worker1: keep an RRef worker0 owns across the cut."""
    global _held
    _held = rref
    return True


def held_value():
    return _held.to_here(timeout=10)


def drop_held():
    global _held
    _held = None
    gc.collect()
    return True


def owned_count():
    gc.collect()
    return _agent.require_agent().owned_rref_count()


def link_cut(rank, world_size, ready_file, cut_file, healed_file):
    """worker0 and worker2 share a namespace; worker1 is across the link."""
    init(rank, world_size, rpc_timeout=120)
    out = {}
    if rank == 0:
        theirs = rpc.remote("worker1", add, args=(40, 2))  # owned across the link
        mine = rpc.remote("worker0", add, args=(1, 1))
        rpc.rpc_sync("worker1", hold, args=(mine,))
        out["before"] = theirs.to_here()
        with open(ready_file, "w") as f:
            f.write("ready")
        wait_for_file(cut_file, 30)
        start = time.monotonic()
        fut = rpc.rpc_async("worker1", add, args=(1, 2))
        out["survivor"] = rpc.rpc_sync("worker2", add, args=(2, 2))
        _, out["cut_call"] = error_of(fut.wait)
        out["cut_call_failed_after"] = time.monotonic() - start
        with open(cut_file + ".seen", "w") as f:
            f.write("seen")
        wait_for_file(healed_file, 60)
        deadline = time.monotonic() + 20
        while True:  # the first calls may still find the link coming back up
            try:
                out["after_heal"] = rpc.rpc_sync("worker1", add, args=(3, 4), timeout=5)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        out["theirs_after"] = theirs.to_here(timeout=10)
        out["held_after"] = rpc.rpc_sync("worker1", held_value)
        rpc.rpc_sync("worker1", drop_held)
        del theirs, mine
        gc.collect()
        # Counts settle a few ms after the calls that change them.
        wait_until(lambda: owned_count() == (0, 0), timeout=10)
        wait_until(lambda: rpc.rpc_sync("worker1", owned_count) == (0, 0), timeout=10)
        out["owned_here"], out["owned_there"] = owned_count(), rpc.rpc_sync("worker1", owned_count)
        for w in ("worker1", "worker2"):
            rpc.rpc_sync(w, set_done)
    else:
        wait_done(180)
    rpc.shutdown()
    return out


def listen_and_wait(rank, world_size, ready_file, done_file):
    """Join, tell the test (which then looks at this process's sockets), and leave once told."""
    init(rank, world_size)
    with open(ready_file, "w") as f:
        f.write("listening")
    wait_for_file(done_file, 60)
    rpc.shutdown()

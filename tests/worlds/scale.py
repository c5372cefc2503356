"""A big world on one host: every worker joins, calls a handful of peers, reports what it
costs, and leaves gracefully."""

import os
import threading
import time

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent

from .common import init, rss_kib, shm_mappings

PEERS = 5


def identify(caller):
    return rpc.get_worker_info().id, caller


def _fds():
    return len(os.listdir("/proc/self/fd"))


def calls_to_peers(rank, world_size):
    """``PEERS`` rpc_async calls to the next ranks; returns what this worker got and cost."""
    started = time.monotonic()
    # A loaded host takes long to start a few hundred interpreters: the join waits for them.
    init(rank, world_size, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", rpc_timeout=300)
    joined = time.monotonic() - started
    peers = [(rank + k) % world_size for k in range(1, PEERS + 1) if (rank + k) % world_size != rank]
    futs = [rpc.rpc_async(f"worker{p}", identify, args=(rank,)) for p in peers]
    answers = [f.wait() for f in futs]
    agent = _agent.require_agent()
    out = {
        "answers": answers,
        "peers": peers,
        "join_s": joined,
        "goroutines": agent.goroutines(),
        "threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "fds": _fds(),
        "rss_mib": rss_kib() / 1024,
        # One region per stream: to the peers it called and from those that called it.
        "shm_regions": shm_mappings(),
    }
    rpc.shutdown()
    return out


def _small(x):
    return x


def _big(arr):
    return int(arr[0])


def full_mesh(rank, world_size, idle_dir, idle_s):
    """Every worker calls every other (``MESH_SMALL`` small calls and ``MESH_BIG`` 1 MiB
    arrays each), then stays idle for ``idle_s`` seconds with its streams open (it creates
    ``idle_dir/<rank>`` as it starts) before a graceful shutdown: the test reads the host's
    shared memory at its peak and while the world idles."""
    import numpy as np

    init(rank, world_size, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", rpc_timeout=600)
    arr = np.full(1 << 20, rank % 251, dtype=np.uint8)
    peers = [p for p in range(world_size) if p != rank]
    started = time.monotonic()
    wrong = 0
    for p in peers:
        futs = [rpc.rpc_async(f"worker{p}", _small, args=(i,)) for i in range(MESH_SMALL)]
        wrong += sum(f.wait() != i for i, f in enumerate(futs))
        for _ in range(MESH_BIG):
            wrong += rpc.rpc_sync(f"worker{p}", _big, args=(arr,)) != rank % 251
    took = time.monotonic() - started
    with open(os.path.join(idle_dir, str(rank)), "w") as f:
        f.write("idle")
    time.sleep(float(idle_s))
    out = {"wrong": wrong, "mesh_s": took, "shm_regions": shm_mappings()}
    rpc.shutdown()
    return out


MESH_SMALL = 50
MESH_BIG = 8

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

"""A world under attack: rank 0 publishes the address it listens on for a hostile peer
(tests/hostilepeer) to attack, while the other ranks keep making real calls, to rank 0 and to
each other, until the test tells them to stop.

Files in ``sync_dir`` are the only signals: ``addr`` (written by rank 0, atomically),
``calling<rank>`` (written by ranks 1.. after their first round of calls succeeded) and ``stop``
(created by the test). Every wait is bounded by ``deadline_s``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List

import numpy as np

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent

from .common import add, init

log = logging.getLogger(__name__)

# Honest calls get this long: well under how long the hostile peer holds the receive budget
# (its -hold), so a worker starved by it shows up as failed calls rather than slow ones.
CALL_TIMEOUT_S = 6.0
# Above the 1 MiB chunk size: these travel in chunks and need the receiver's receive budget.
BIG = 3 << 20


def checksum(data: Any) -> int:
    """The sum of a bytes-like or numpy payload's bytes, to check it arrived intact."""
    return int(np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8).sum(dtype=np.uint64))


def _write_atomically(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _stopped(sync_dir: str) -> bool:
    return os.path.exists(os.path.join(sync_dir, "stop"))


def _wait_stop(sync_dir: str, deadline: float) -> None:
    """Poll for the stop file until the deadline (bounded: the world must end by itself)."""
    while not _stopped(sync_dir):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never created the stop file")
        time.sleep(0.05)


class Caller:
    """Makes a mix of real calls to one peer and counts their outcomes."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ok = 0
        self.failed = 0
        self.errors: List[str] = []
        self.max_latency = 0.0
        self.round = 0

    def _outcome(self, what: str, started: float, fn) -> None:
        try:
            fn()
        except Exception as exc:  # every failure is counted; the test reports them
            self.failed += 1
            if len(self.errors) < 20:
                self.errors.append(f"{what}: {type(exc).__name__}: {exc}"[:500])
            log.warning("honest call %s failed: %s", what, exc)
        else:
            self.ok += 1
        self.max_latency = max(self.max_latency, time.monotonic() - started)

    def call_round(self, peer: str) -> None:
        """One round to peer: a small rpc_sync, a big numpy rpc_async and a big bytes rpc_sync."""
        self.round += 1
        seed = (self.rank * 1000 + self.round) % 251
        arr = np.full(BIG, seed, dtype=np.uint8)
        blob = bytes([seed]) * (BIG + 12345)
        started = time.monotonic()
        fut = rpc.rpc_async(peer, checksum, args=(arr,), timeout=CALL_TIMEOUT_S)

        def small() -> None:
            got = rpc.rpc_sync(peer, add, args=(self.round, seed), timeout=CALL_TIMEOUT_S)
            assert got == self.round + seed, f"add returned {got}"

        def big_bytes() -> None:
            got = rpc.rpc_sync(peer, checksum, args=(blob,), timeout=CALL_TIMEOUT_S)
            assert got == seed * len(blob), f"checksum of bytes returned {got}"

        def big_array() -> None:
            got = fut.wait()
            assert got == seed * BIG, f"checksum of the array returned {got}"

        self._outcome(f"add to {peer}", started, small)
        self._outcome(f"bytes to {peer}", started, big_bytes)
        self._outcome(f"numpy to {peer}", started, big_array)

    def result(self) -> Dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed, "errors": self.errors, "max_latency": self.max_latency, "rounds": self.round}


def run(rank: int, world_size: int, sync_dir: str, deadline_s: str) -> Dict[str, Any]:
    """Rank 0 serves and publishes its address; the others call until told to stop."""
    deadline = time.monotonic() + float(deadline_s)
    init(rank, world_size, rpc_timeout=CALL_TIMEOUT_S)
    out: Dict[str, Any] = {"pid": os.getpid()}
    if rank == 0:
        _write_atomically(os.path.join(sync_dir, "addr"), _agent.require_agent().address)
        _wait_stop(sync_dir, deadline)
    else:
        caller = Caller(rank)
        peers = [f"worker{i}" for i in range(world_size) if i != rank]
        for peer in peers:
            caller.call_round(peer)
        _write_atomically(os.path.join(sync_dir, f"calling{rank}"), "calling")
        while not _stopped(sync_dir):
            if time.monotonic() > deadline:
                raise TimeoutError("the test never created the stop file")
            for peer in peers:
                caller.call_round(peer)
        out.update(caller.result())
    rpc.shutdown()
    return out

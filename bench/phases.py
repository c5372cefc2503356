"""Where an rpc_sync's time goes: timestamps taken on both sides of each call, and the
hand-offs and boundary calls it costs.

``python phases.py`` starts a world of two on loopback (this file, as rank 0 and rank 1) once
per transport (shared memory, then gRPC, pinned with TENSORPLAY_RPC_TRANSPORTS) and prints the
p50 of each phase over 2,000 small calls, then, per call and per side: the Go/Python boundary
calls (calls into the extension) and the thread hand-offs (voluntary context switches: each is
a thread going to sleep to be woken by another). Both processes read the same monotonic clock.

Then the same phases of calls carrying a 16 MiB torch tensor (one way), beside what copying
those bytes costs on this machine, timed in the same process: memcpy, and the kernel's copy
between processes (``process_vm_readv``, which torch's CMA channel uses, as does our
shared-memory transport for a message too big for a stream's landing area) on one thread and
on two. A 16 MiB message lands: its one copy is the sender's memcpy into shared memory.
"""

import collections
import logging
import os
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent

import common

# PHASES_CALLS lets a test run it briefly.
CALLS = int(os.environ.get("PHASES_CALLS", "2000"))
BIG_CALLS = max(20, CALLS // 10)
BIG_BYTES = 16 << 20


class BoundaryCounter:
    """Stands in for the extension module and counts the calls made through it."""

    def __init__(self, module) -> None:
        self._module = module
        self.calls = 0

    def __getattr__(self, name):
        self.calls += 1
        return getattr(self._module, name)


def count_boundary_calls() -> BoundaryCounter:
    """Route every call into the Go extension through a counter."""
    from tensorplay_rpc._native import pybind

    counter = BoundaryCounter(pybind._pybind)
    pybind._pybind = counter
    return counter


def time_phases(agent, args, calls: int) -> Dict[str, List[float]]:
    """The phases of ``calls`` rpc_sync-like calls to rank 1 carrying ``args``, after a warm-up."""
    phases: Dict[str, List[float]] = collections.defaultdict(list)
    warm = min(200, calls)
    for i in range(calls + warm):
        t0 = time.perf_counter()
        fut = agent._send(agent.destination(1), (_agent._CALL, common.stamps, args, {}), -1, internal=True)  # as rpc_sync
        t1 = time.perf_counter()
        go_call = fut._go_call  # the reply's arrival, timed apart from reading it
        while not go_call.Wait(100, False):
            pass
        t2 = time.perf_counter()
        picked, ran = fut.wait()
        t3 = time.perf_counter()
        if i >= warm:
            phases["caller: pickle and queue the request"].append(t1 - t0)
            phases["to the callee's Python thread"].append(picked - t1)
            phases["callee: read, unpickle, run"].append(ran - picked)
            phases["back: pickle, reply, caller wakes"].append(t2 - ran)
            phases["caller: read and unpickle the reply"].append(t3 - t2)
            phases["total"].append(t3 - t0)
    return phases


def print_phases(phases: Dict[str, List[float]]) -> None:
    for name, values in phases.items():
        values.sort()
        print(f"{name:40s} p50 {values[len(values) // 2] * 1e6:7.1f} us")


def measure() -> None:
    agent = _agent.require_agent()
    print(f"transport: {os.environ.get('TENSORPLAY_RPC_TRANSPORTS')}")
    print_phases(time_phases(agent, (), CALLS))
    n = 2000
    for _ in range(100):
        rpc.rpc_sync("w1", common.add, args=(1, 2))
    mine, theirs = common.costs(), rpc.rpc_sync("w1", common.costs)
    for _ in range(n):
        rpc.rpc_sync("w1", common.add, args=(1, 2))
    mine_after, theirs_after = common.costs(), rpc.rpc_sync("w1", common.costs)
    for side, before, after in (("caller", mine, mine_after), ("callee", theirs, theirs_after)):
        print(f"{side}: {(after[0] - before[0]) / n:4.1f} boundary calls, {(after[1] - before[1]) / n:4.1f} hand-offs per rpc_sync")
    import torch

    print(f"\nwith a {BIG_BYTES >> 20} MiB torch tensor (one way), {BIG_CALLS} calls:")
    phases = time_phases(agent, (torch.ones(BIG_BYTES, dtype=torch.uint8),), BIG_CALLS)
    print_phases(phases)
    total = sorted(phases["total"])[len(phases["total"]) // 2]
    print(f"{'rate':40s}     {BIG_BYTES / total / 1e9:7.1f} GB/s")


def copy_rates(size: int = BIG_BYTES, reps: int = 20) -> Tuple[float, Optional[float], Optional[float]]:
    """GB/s of copying ``size`` bytes between two torch tensors already touched, best of
    ``reps``: memcpy, then process_vm_readv (from this process, as from a peer) on one thread and
    on two (None where the system refuses it, as a seccomp filter may). Tensors, not numpy
    arrays: numpy asks for huge pages for big arrays, which the kernel copies faster."""
    import ctypes
    import threading

    import torch

    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    libc.process_vm_readv.restype = ctypes.c_ssize_t

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    src, dst = torch.ones(size, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8)
    pid = os.getpid()

    def read(at: int, n: int) -> None:
        local, remote = IoVec(dst.data_ptr() + at, n), IoVec(src.data_ptr() + at, n)
        if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != n:
            raise OSError(ctypes.get_errno(), "process_vm_readv")

    def on_threads(k: int) -> None:
        # ctypes lets go of the GIL for the call, so the threads copy at once.
        part = size // k
        threads = [threading.Thread(target=read, args=(i * part, part)) for i in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def best(copy: Callable[[], object]) -> float:
        fastest = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            copy()
            fastest = min(fastest, time.perf_counter() - t0)
        return size / fastest / 1e9

    memcpy = best(lambda: ctypes.memmove(dst.data_ptr(), src.data_ptr(), size))
    try:
        read(0, size)
    except OSError as err:
        logging.warning("process_vm_readv is refused here: %s", err)
        return memcpy, None, None
    return memcpy, best(lambda: read(0, size)), best(lambda: on_threads(2))


def worker(rank: int) -> None:
    common.BOUNDARY_CALLS[0] = count_boundary_calls()
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2)
    if rank == 1:
        agent = _agent.require_agent()
        serve = agent._serve

        def timed_serve(request):
            common.PICKED_AT[0] = time.perf_counter()
            serve(request)

        agent._serve = timed_serve
    else:
        measure()
    rpc.shutdown()


def main() -> int:
    code = 0
    for transport in ("shm", "tcp", "grpc"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TENSORPLAY_RPC_TRANSPORTS=transport)
        procs = [subprocess.Popen([sys.executable, __file__, str(rank)], env=env) for rank in (1, 0)]
        for p in procs:
            try:
                code |= p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                code = 1
        print()
    memcpy, one, two = copy_rates()
    across = "refused" if one is None or two is None else f"{one:.1f} GB/s on one thread, {two:.1f} GB/s on two"
    print(f"copying {BIG_BYTES >> 20} MiB here: memcpy {memcpy:.1f} GB/s, process_vm_readv {across}")
    return code


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(int(sys.argv[1]))
    else:
        sys.exit(main())

"""Where a small rpc_sync's time goes: timestamps taken on both sides of each call, and the
hand-offs and boundary calls it costs.

``python phases.py`` starts a world of two on loopback (this file, as rank 0 and rank 1) once
per transport (shared memory, then gRPC, pinned with TENSORPLAY_RPC_TRANSPORTS) and prints the
p50 of each phase over 2,000 calls, then, per call and per side: the Go/Python boundary calls
(calls into the extension) and the thread hand-offs (voluntary context switches: each is a
thread going to sleep to be woken by another). Both processes read the same monotonic clock.
"""

import collections
import os
import socket
import subprocess
import sys
import time

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent

import common

# PHASES_CALLS lets a test run it briefly.
CALLS = int(os.environ.get("PHASES_CALLS", "2000"))


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


def measure() -> None:
    agent = _agent.require_agent()
    phases = collections.defaultdict(list)
    for i in range(CALLS + 200):
        t0 = time.perf_counter()
        fut = agent._send(agent.destination(1), (_agent._CALL, common.stamps, (), {}), -1, internal=True)  # as rpc_sync
        t1 = time.perf_counter()
        go_call = fut._go_call  # the reply's arrival, timed apart from reading it
        while not go_call.Wait(100, False):
            pass
        t2 = time.perf_counter()
        picked, ran = fut.wait()
        t3 = time.perf_counter()
        if i >= 200:
            phases["caller: pickle and queue the request"].append(t1 - t0)
            phases["to the callee's Python thread"].append(picked - t1)
            phases["callee: read, unpickle, run"].append(ran - picked)
            phases["back: pickle, reply, caller wakes"].append(t2 - ran)
            phases["caller: read and unpickle the reply"].append(t3 - t2)
            phases["total"].append(t3 - t0)
    print(f"transport: {os.environ.get('TENSORPLAY_RPC_TRANSPORTS')}")
    for name, values in phases.items():
        values.sort()
        print(f"{name:40s} p50 {values[len(values) // 2] * 1e6:7.1f} us")
    n = 2000
    for _ in range(100):
        rpc.rpc_sync("w1", common.add, args=(1, 2))
    mine, theirs = common.costs(), rpc.rpc_sync("w1", common.costs)
    for _ in range(n):
        rpc.rpc_sync("w1", common.add, args=(1, 2))
    mine_after, theirs_after = common.costs(), rpc.rpc_sync("w1", common.costs)
    for side, before, after in (("caller", mine, mine_after), ("callee", theirs, theirs_after)):
        print(f"{side}: {(after[0] - before[0]) / n:4.1f} boundary calls, {(after[1] - before[1]) / n:4.1f} hand-offs per rpc_sync")


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
    for transport in ("shm", "grpc"):
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
    return code


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(int(sys.argv[1]))
    else:
        sys.exit(main())

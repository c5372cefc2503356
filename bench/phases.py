"""Where a small rpc_sync's time goes: timestamps taken on both sides of each call.

``python phases.py`` starts a world of two on loopback (this file, as rank 0 and rank 1) and
prints the p50 of each phase over 2,000 calls. Both processes read the same monotonic clock.
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

CALLS = 2000


def measure() -> None:
    agent = _agent.require_agent()
    phases = collections.defaultdict(list)
    for i in range(CALLS + 200):
        t0 = time.perf_counter()
        fut = agent._send(agent.workers[1], (_agent._CALL, common.stamps, (), {}), -1, notify=False)
        t1 = time.perf_counter()
        go_call = fut._go_call  # the reply's arrival, timed apart from reading it
        while not go_call.Wait(100):
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
    for name, values in phases.items():
        values.sort()
        print(f"{name:40s} p50 {values[len(values) // 2] * 1e6:7.1f} us")


def worker(rank: int) -> None:
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, __file__, str(rank)], env=env) for rank in (1, 0)]
    code = 0
    for p in procs:
        try:
            code |= p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            code = 1
    return code


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(int(sys.argv[1]))
    else:
        sys.exit(main())

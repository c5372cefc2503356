"""The example from the tensorplay.distributed.rpc reference page, run as __main__ on two
workers; `add` is defined in __main__ after init_rpc, so the callee's script may reach the
definition only after the call arrives (the callee waits for it briefly)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tensorplay_rpc as rpc  # noqa: E402

# run on both workers, each with its own name:
rank = int(os.environ["RANK"])
rpc.init_rpc("trainer" if rank == 1 else "master", rank=rank, world_size=2)


def add(a, b):
    return a + b


def make_scaler(factor):
    def scale(x):
        return x * factor

    return scale


if rank == 0:
    result = rpc.rpc_sync("trainer", add, args=(3, 4))
    print(result)
    print(rpc.rpc_sync("trainer", lambda x: x + 1, args=(41,)))
    print(rpc.rpc_sync("trainer", make_scaler(3), args=(5,)))
    print(rpc.rpc_async("trainer", add, kwargs={"a": "ab", "b": "cd"}).wait())

rpc.shutdown()

"""RRefs whose owner leaves a dynamic world, for tests/test_dynamic_world.py.

    python dynamic_rrefs.py RANK PORT SYNC_DIR

w0 holds an RRef owned by w1; w1 leaves, then joins again under its name and rank. w0 writes
what each use of the RRef did (``report``, JSON) to SYNC_DIR.
"""

import gc
import json
import os
import sys
import time

import tensorplay_rpc as rpc

from steps import Steps

RANK, PORT, SYNC = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
steps = Steps(SYNC, f"w{RANK}")
mark, wait = steps.mark, steps.wait


def join() -> None:
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{PORT}", rpc_timeout=10)
    rpc.init_rpc(f"w{RANK}", rank=RANK, world_size=None, rpc_backend_options=options)


def attempt(fn) -> str:
    started = time.monotonic()
    try:
        outcome = repr(fn())
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    return f"{outcome} [{time.monotonic() - started:.1f} s]"


def owned_rrefs() -> str:
    return rpc._get_debug_info()["num_owner_rrefs"]


if RANK == 0:
    join()
    mark("joined0")
    wait("joined1")
    rref = rpc.remote("w1", list, args=(list(range(1000)),))
    report = {"before": len(rref.to_here())}
    mark("made")
    wait("left1")
    report["owner"] = rref.owner().name
    report["to_here"] = attempt(rref.to_here)
    report["proxy"] = attempt(lambda: rref.rpc_sync().__len__())
    report["pass_on"] = attempt(lambda: rpc.rpc_sync("w0", len, args=(rref,)))
    mark("checked")
    wait("rejoined1")
    report["call_again"] = attempt(lambda: rpc.rpc_sync("w1", len, args=([1, 2],)))
    report["to_here_again"] = attempt(rref.to_here)
    del rref
    gc.collect()
    # A release the drop sent w1 would go before this call on the ordered stream to it.
    report["owned_on_new_w1"] = rpc.rpc_sync("w1", owned_rrefs)
    with open(os.path.join(SYNC, "report"), "w") as f:
        json.dump(report, f)
    mark("done0")
    wait("left1again")
    rpc.shutdown()
else:
    wait("joined0")
    join()
    mark("joined1")
    wait("made")
    rpc.shutdown()
    mark("left1")
    wait("checked")
    join()
    mark("rejoined1")
    wait("done0")
    rpc.shutdown()
    mark("left1again")

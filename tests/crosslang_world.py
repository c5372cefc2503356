"""A Python worker of a world with a Go worker (examples/goworker), for tests/test_crosslang.py.

    python crosslang_world.py RANK OUT_JSON [killed]

MASTER_ADDR and MASTER_PORT locate the store. Rank 0 is "trainer": it exposes train_step and
boom to every language and calls the Go worker's functions, writing what each call did to
OUT_JSON. Rank 1 is "helper": it exposes "double", which the trainer calls by name too.
With "killed", the world is the trainer and the Go worker (rank 1) alone, and the trainer
makes one long call, during which the test kills the Go worker.
"""

import gc
import json
import os
import sys
import time

import numpy as np

import tensorplay_rpc as rpc

RANK, OUT = int(sys.argv[1]), sys.argv[2]
KILLED = sys.argv[3:] == ["killed"]
GO = "feature-store"


@rpc.expose
def train_step(batch, lr):
    """Go calls this with a list of floats and a float."""
    return {"loss": float(sum(batch)) * lr, "n": float(len(batch))}


@rpc.expose
def normalize(x):
    """Go calls this with a float64 array; it gets a numpy array, and one goes back."""
    return x / x.sum()


@rpc.expose
def slow(seconds):
    time.sleep(seconds)


@rpc.expose("boom")
def explode(why):
    raise ValueError(f"boom: {why}")


def double(x):
    return x * 2


def owned_counts():
    """Run on the helper: the RRefs it owns (Python's table, Go's)."""
    return list(rpc._get_current_rpc_agent().owned_rref_count())


def to_here_of(rref):
    """Run on the helper: fetch an RRef's value from its owner."""
    return rref.to_here()


def _refusal(fn):
    try:
        fn()
        return None
    except ValueError as exc:
        return "ValueError"


def outcome(fn):
    """What fn() did: its value, or its exception's type and message."""
    started = time.monotonic()
    try:
        value = fn()
        return {"value": value, "seconds": time.monotonic() - started}
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - started}


if KILLED:
    rpc.init_rpc("trainer", rank=0, world_size=2)
    out = {"killed": outcome(lambda: rpc.rpc_sync(GO, rpc.remote_function("sleep"), args=(60,), timeout=0))}
    rpc.shutdown()
    with open(OUT, "w") as fh:
        json.dump(out, fh)
    sys.exit(0)

if RANK == 1:
    rpc.expose("double", double)  # after the decorator form: the call form
else:
    rpc.expose_imports()  # the trainer serves importable functions too; the helper does not
name = "trainer" if RANK == 0 else "helper"
rpc.init_rpc(name, rank=RANK, world_size=3)
out = {}
if RANK == 0:
    f = rpc.remote_function
    out["add"] = outcome(lambda: rpc.rpc_sync(GO, f("add"), args=(2, 3.5)))
    out["add_async"] = outcome(lambda: rpc.rpc_async(GO, f("add"), args=(1.25, 1)).wait())
    out["lookup"] = outcome(lambda: rpc.rpc_sync(GO, f("lookup"), args=([3, 4],)))
    out["lookup_error"] = outcome(lambda: rpc.rpc_sync(GO, f("lookup"), args=([1, -7],)))
    out["wrong_arg_count"] = outcome(lambda: rpc.rpc_sync(GO, f("add"), args=(1,)))
    out["wrong_arg_type"] = outcome(lambda: rpc.rpc_sync(GO, f("add"), args=("one", 2)))
    out["no_such_function"] = outcome(lambda: rpc.rpc_sync(GO, f("nope"), args=()))
    out["timeout"] = outcome(lambda: rpc.rpc_sync(GO, f("sleep"), args=(30,), timeout=0.5))
    out["kwargs"] = outcome(lambda: rpc.rpc_sync(GO, f("add"), args=(1,), kwargs={"b": 2}))
    out["unsendable"] = outcome(lambda: rpc.rpc_sync(GO, f("add"), args=(object(), 1)))
    out["python_by_name"] = outcome(lambda: rpc.rpc_sync("helper", f("double"), args=([1, "a"],)))
    out["python_by_name_error"] = outcome(lambda: rpc.rpc_sync(name, f("boom"), args=("self",)))
    # A function exposed after init_rpc is served at once.
    rpc.expose("late", lambda: "late")
    out["late"] = outcome(lambda: rpc.rpc_sync(name, f("late")))
    out["import_allowed"] = outcome(lambda: rpc.rpc_sync(name, f("operator:mul"), args=(6, 7)))
    out["import_refused"] = outcome(lambda: rpc.rpc_sync("helper", f("operator:mul"), args=(6, 7)))
    out["import_missing"] = outcome(lambda: rpc.rpc_sync(name, f("operator:no_such_thing")))
    for dtype in ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"):
        arr = (np.arange(12) % 2 if dtype == "bool" else np.arange(12) * 3 - 5 * (dtype[0] != "u")).astype(dtype).reshape(3, 4)
        out[f"stats_{dtype}"] = outcome(lambda: rpc.rpc_sync(GO, f("stats"), args=(arr,)))
        out[f"stats_{dtype}"]["expected"] = {"dtype": dtype, "shape": [3, 4], "sum": float(arr.sum())}
    big = np.arange(1 << 24, dtype=np.float32)  # 64 MiB
    out["stats_big"] = outcome(lambda: rpc.rpc_sync(GO, f("stats"), args=(big,)))
    out["stats_big"]["expected"] = {"dtype": "float32", "shape": [1 << 24], "sum": float(big.astype(np.float64).sum())}
    strided = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]  # not contiguous: sent as a copy
    out["stats_strided"] = outcome(lambda: rpc.rpc_sync(GO, f("stats"), args=(strided,)))
    out["stats_strided"]["expected"] = {"dtype": "int64", "shape": [4, 3], "sum": float(strided.sum())}
    try:
        import torch

        t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
        out["stats_tensor"] = outcome(lambda: rpc.rpc_sync(GO, f("stats"), args=(t,)))
        out["stats_tensor"]["expected"] = {"dtype": "float64", "shape": [2, 3], "sum": 15.0}
    except ImportError:  # the test runs where python3-torch is installed
        out["stats_tensor"] = {"type": "ImportError"}
    for name, arr in (("scale_small", np.arange(6, dtype=np.float32).reshape(2, 3)), ("scale_big", np.arange(1 << 22, dtype=np.float32))):
        def scaled(arr=arr):
            back = rpc.rpc_async(GO, f("scale"), args=(arr, 2)).wait()
            return {"dtype": str(back.dtype), "shape": list(back.shape), "equal": bool((back == arr * 2).all()), "writable": back.flags.writeable}
        out[name] = outcome(scaled)
    out["complex"] = outcome(lambda: rpc.rpc_sync(GO, f("stats"), args=(np.zeros(2, dtype=np.complex64),)))
    # remote(): the value stays on the Go worker until the last RRef to it is gone.
    kept = rpc.remote(GO, f("add"), args=(2, 5))
    out["remote_to_here"] = outcome(lambda: [kept.to_here(), kept.to_here(), kept.owner_name()])
    out["remote_passed_on"] = outcome(lambda: rpc.rpc_sync("helper", to_here_of, args=(kept,)))
    scaled_rref = rpc.remote(GO, f("scale"), args=(np.arange(4, dtype=np.float32), 3))
    out["remote_array"] = outcome(lambda: scaled_rref.to_here().tolist())
    out["remote_error"] = outcome(lambda: rpc.remote(GO, f("lookup"), args=([-1],)).to_here())
    out["remote_proxy"] = outcome(lambda: kept.rpc_sync().anything())
    out["remote_on_python"] = outcome(lambda: rpc.remote("helper", f("double"), args=(21,)).to_here())
    gc.collect()
    deadline = time.monotonic() + 20  # the helper's RRef is released and dropped everywhere
    while rpc.rpc_sync("helper", owned_counts) != [0, 0] and time.monotonic() < deadline:
        time.sleep(0.05)
    out["helper_owns_after_release"] = outcome(lambda: rpc.rpc_sync("helper", owned_counts))
    out["bad_names"] = outcome(lambda: [_refusal(lambda: rpc.expose(n, double)) for n in ("", "a\nb", "py", "_tensorplay/x")]
                               + [_refusal(lambda: rpc.remote_function("py"))])
    out["owned_while_held"] = outcome(lambda: rpc.rpc_sync(GO, f("owned")))
    del kept, scaled_rref
    gc.collect()
    deadline = time.monotonic() + 20
    while rpc.rpc_sync(GO, f("owned")) and time.monotonic() < deadline:
        time.sleep(0.05)
    out["owned_after_release"] = outcome(lambda: rpc.rpc_sync(GO, f("owned")))
    out["after_calls"] = outcome(lambda: rpc.rpc_sync(GO, f("add"), args=(1.5, 0)))
rpc.shutdown()
with open(OUT, "w") as fh:
    json.dump(out, fh)

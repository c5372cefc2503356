"""Scenarios where Ctrl-C (SIGINT) reaches a worker blocked in the API."""

import signal
import time

import tensorplay_rpc as rpc

from .common import init, slow


def blocked(rank, world_size, what, ready_file, report_file):
    """worker0 blocks in `what` and records when KeyboardInterrupt reached it; worker1 only
    serves (the test ends it)."""
    # As in a terminal: Python leaves SIGINT ignored when it started ignored, as it does under
    # a suite run in the background (nohup ... &), and Ctrl-C would then never arrive.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if what == "wait_torch_future":
        import torch  # noqa: F401 - before init_rpc on every rank: the program uses torch
    if rank == 1:
        if what != "init":
            init(rank, world_size)
        time.sleep(120)
        return None
    calls = {
        "rpc_sync": lambda: rpc.rpc_sync("worker1", slow, args=(60,)),
        "wait": lambda: rpc.rpc_async("worker1", slow, args=(60,)).wait(),
        # With torch imported, the future is a torch one too: its wait is still ours.
        "wait_torch_future": lambda: rpc.rpc_async("worker1", slow, args=(60,)).wait(),
        "to_here": lambda: rpc.remote("worker1", slow, args=(60,)).to_here(),
        "shutdown": rpc.shutdown,
    }
    if what == "init":
        block = lambda: init(rank, world_size)  # noqa: E731 - worker1 never joins
    else:
        init(rank, world_size)
        block = calls[what]
    with open(ready_file, "w") as f:
        f.write("blocking")
    try:
        block()
    except KeyboardInterrupt:
        interrupted_at = time.monotonic()
    else:
        raise AssertionError(f"{what} returned instead of being interrupted")
    if what not in ("init", "shutdown"):
        rpc.shutdown(graceful=False)
    with open(report_file, "w") as f:
        f.write(repr(interrupted_at))
    return what

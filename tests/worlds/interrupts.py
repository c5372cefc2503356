"""Scenarios where Ctrl-C (SIGINT) reaches a worker blocked in the API."""

import os
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
        # The program has a signal wakeup fd of its own (as an asyncio loop with signal
        # handlers has): it is left in place, and still gets the signal.
        "rpc_sync_with_a_wakeup_fd_of_its_own": lambda: rpc.rpc_sync("worker1", slow, args=(60,)),
        "shutdown": rpc.shutdown,
    }
    if what == "init":
        block = lambda: init(rank, world_size)  # noqa: E731 - worker1 never joins
    else:
        init(rank, world_size)
        block = calls[what]
    own_wakeup = None
    if what == "rpc_sync_with_a_wakeup_fd_of_its_own":
        own_wakeup = os.pipe2(os.O_NONBLOCK)
        signal.set_wakeup_fd(own_wakeup[1])
    with open(ready_file, "w") as f:
        f.write("blocking")
    try:
        block()
    except KeyboardInterrupt:
        interrupted_at = time.monotonic()
    else:
        raise AssertionError(f"{what} returned instead of being interrupted")
    if own_wakeup is not None:
        assert signal.set_wakeup_fd(-1) == own_wakeup[1], "the program's signal wakeup fd was replaced"
        got = os.read(own_wakeup[0], 64)
        assert bytes([signal.SIGINT]) in got, f"the program's wakeup fd did not get the signal: {got!r}"
    if what not in ("init", "shutdown"):
        rpc.shutdown(graceful=False)
    with open(report_file, "w") as f:
        f.write(repr(interrupted_at))
    return what

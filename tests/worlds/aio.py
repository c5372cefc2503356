"""Scenarios for awaiting futures in asyncio code."""

import asyncio
import time

import tensorplay_rpc as rpc

from .common import add, init, raise_value_error, slow


async def _await_calls() -> dict:
    out = {}
    # 1,000 calls awaited together.
    values = await asyncio.gather(*(rpc.rpc_async("worker1", add, args=(i, 1)) for i in range(1000)))
    out["gather"] = values == [i + 1 for i in range(1000)]
    # Awaiting mixes with then() and collect_all().
    out["then"] = await rpc.rpc_async("worker1", add, args=(20, 1)).then(lambda f: f.value() * 2)
    done = await rpc.collect_all([rpc.rpc_async("worker1", add, args=(1, 1)), rpc.rpc_async("worker1", add, args=(2, 2))])
    out["collect_all"] = [f.value() for f in done]
    # A remote error is raised at the await.
    try:
        await rpc.rpc_async("worker1", raise_value_error, args=("awaited",))
        out["error"] = None
    except ValueError as exc:
        out["error"] = [type(exc).__name__, "awaited" in str(exc)]
    # The loop runs while a call is pending: a ticker keeps ticking.
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    started = time.monotonic()
    out["slow"] = await rpc.rpc_async("worker1", slow, args=(0.5,))
    out["ticks_while_waiting"] = ticks >= 10
    out["waited_s"] = round(time.monotonic() - started, 1)
    tick_task.cancel()
    # Cancelling the task that awaits leaves the future alone: it completes, and can be waited.
    fut = rpc.rpc_async("worker1", slow, args=(0.3,))
    task = asyncio.create_task(_awaiting(fut))
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
        out["cancelled"] = False
    except asyncio.CancelledError:
        out["cancelled"] = True
    out["after_cancel"] = fut.wait()
    # Awaits given up on a pending call leave no callbacks behind.
    pending = rpc.rpc_async("worker1", slow, args=(0.5,))
    for _ in range(20):
        try:
            await asyncio.wait_for(pending, 0.001)
        except asyncio.TimeoutError:
            pass
    out["callbacks_left"] = len(pending._callbacks)
    pending.wait()
    # A future that is already complete is awaited at once.
    out["already_done"] = await fut
    return out


async def _awaiting(fut):
    return await fut


def await_calls(rank, world_size):
    init(rank, world_size)
    out = asyncio.run(_await_calls()) if rank == 0 else {}
    rpc.shutdown()
    return out

"""Futures awaited in asyncio code (issue 14): the loop goes on while calls are pending. This
process is w0 of the plugin's world (tensorplay_rpc.testing) and awaits calls to w1."""

import asyncio
import time

import pytest

import tensorplay_rpc as rpc
from worlds.common import add, raise_value_error, slow

pytestmark = pytest.mark.rpc_world(workers=1, timeout=60)


def test_a_thousand_calls_awaited_with_gather(rpc_world):
    async def gather():
        return await asyncio.gather(*(rpc.rpc_async("w1", add, args=(i, 1)) for i in range(1000)))

    assert asyncio.run(gather()) == [i + 1 for i in range(1000)]


def test_awaiting_mixes_with_then_and_collect_all(rpc_world):
    async def mixed():
        doubled = await rpc.rpc_async("w1", add, args=(20, 1)).then(lambda f: f.value() * 2)
        done = await rpc.collect_all([rpc.rpc_async("w1", add, args=(1, 1)), rpc.rpc_async("w1", add, args=(2, 2))])
        return doubled, [f.value() for f in done]

    assert asyncio.run(mixed()) == (42, [2, 4])


def test_a_remote_error_is_raised_at_the_await(rpc_world):
    async def failing():
        await rpc.rpc_async("w1", raise_value_error, args=("awaited",))

    with pytest.raises(ValueError, match="awaited"):
        asyncio.run(failing())


def test_the_loop_runs_while_a_call_is_pending(rpc_world):
    async def with_ticker():
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        value = await rpc.rpc_async("w1", slow, args=(0.5,))
        task.cancel()
        return value, ticks

    value, ticks = asyncio.run(with_ticker())
    # 0.5 s of waiting holds about 50 ticks of 10 ms; a blocked loop would hold none.
    assert value == 0.5 and ticks >= 10, ticks


def test_cancelling_the_awaiting_task_leaves_the_future_alone(rpc_world):
    fut = rpc.rpc_async("w1", slow, args=(1.0,))

    async def cancel_the_awaiter():
        task = asyncio.create_task(_awaiting(fut))
        await asyncio.sleep(0.05)  # the task is awaiting by now: it has been scheduled
        assert not fut.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await fut  # awaited again, from elsewhere

    assert asyncio.run(cancel_the_awaiter()) == 1.0
    assert fut.wait() == 1.0


def test_awaits_given_up_take_their_callbacks_back(rpc_world):
    pending = rpc.rpc_async("w1", slow, args=(0.5,))

    async def give_up_twenty_times():
        for _ in range(20):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(pending, 0.001)

    asyncio.run(give_up_twenty_times())
    assert len(pending._callbacks) == 0
    assert pending.wait() == 0.5


def test_a_done_future_is_awaited_at_once(rpc_world):
    fut = rpc.rpc_async("w1", add, args=(1, 2))
    fut.wait()

    async def await_done():
        started = time.monotonic()
        value = await fut
        return value, time.monotonic() - started

    value, took = asyncio.run(await_done())
    assert value == 3 and took < 1.0


async def _awaiting(fut):
    return await fut

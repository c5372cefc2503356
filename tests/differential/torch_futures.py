"""torch futures are this backend's futures (issue 16) in a program that imports torch before
init_rpc: the futures rpc_async, then, collect_all and RRef proxies return are
torch.futures.Future instances, torch's wait_all and collect_all take them, chains cross both
kinds, and an async_execution function may return a torch.futures.Future."""

import threading

import torch
import torch.futures

import harness
from harness import differs, scenario


def add(a, b):
    return a + b


def fail(text):
    raise ValueError(text)


def later(value, seconds=0.05):
    """A torch future completed with value by another thread a moment from now."""
    fut = torch.futures.Future()
    threading.Timer(seconds, fut.set_result, args=(value,)).start()
    return fut


def torch_future_doubled(x):
    """An async_execution function (decorated once the backend is known) that returns a
    torch.futures.Future."""
    return later(x * 2)


if harness.rpc is not None:  # None where the module is imported only to read its scenarios
    torch_future_doubled = harness.rpc.functions.async_execution(torch_future_doubled)


def returned_futures():
    fut = harness.rpc.rpc_async("w1", add, args=(1, 2))
    chained = fut.then(lambda f: f.wait() + 1)
    collected = harness.futures.collect_all([harness.rpc.rpc_async("w1", add, args=(1, 1))])
    return fut, chained, collected


@scenario
def rpc_async_returns_torch_futures():
    fut, chained, collected = returned_futures()
    kinds = [isinstance(f, torch.Future) for f in (fut, chained, collected)]  # torch._C.Future
    return kinds, fut.wait(), chained.wait(), [f.wait() for f in collected.wait()]


@differs("ours are torch.futures.Future instances as well; torch's own are only its base, torch._C.Future", "ok [True, True, True]")
def rpc_async_returns_torch_futures_future_class():
    return [isinstance(f, torch.futures.Future) for f in returned_futures()]


@scenario
def torch_wait_all_takes_rpc_futures():
    futs = [harness.rpc.rpc_async("w1", add, args=(i, 10)) for i in range(4)]
    return torch.futures.wait_all(futs)


@scenario
def torch_wait_all_raises_a_failed_rpc_future():
    return torch.futures.wait_all([harness.rpc.rpc_async("w1", add, args=(1, 1)), harness.rpc.rpc_async("w1", fail, args=("no",))])


@scenario
def torch_collect_all_mixes_rpc_and_torch_futures():
    collected = torch.futures.collect_all([harness.rpc.rpc_async("w1", add, args=(2, 3)), later(7)])
    return [f.wait() for f in collected.wait()]


@scenario
def backend_wait_all_mixes_rpc_and_torch_futures():
    return harness.futures.wait_all([later(8), harness.rpc.rpc_async("w2", add, args=(4, 4))])


@scenario
def chains_cross_both_kinds():
    from_torch = later(5).then(lambda f: harness.rpc.rpc_async("w1", add, args=(f.wait(), 1)).wait())
    from_rpc = harness.rpc.rpc_async("w1", add, args=(1, 1)).then(lambda f: later(f.wait() * 100).wait())
    return from_torch.wait(), from_rpc.wait()


@scenario
def async_execution_returns_a_torch_future():
    return harness.rpc.rpc_sync("w1", torch_future_doubled, args=(21,)), harness.rpc.rpc_async("w2", torch_future_doubled, args=(5,)).wait()


@scenario
def rref_proxy_futures_are_torch_futures():
    rref = harness.rpc.remote("w1", list, args=([1, 2, 3],))
    fut = rref.rpc_async().__len__()
    return isinstance(fut, torch.futures.Future), torch.futures.wait_all([fut, rref.rpc_async().count(2)])

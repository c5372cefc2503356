"""Scenarios for remote(), RRefs, async_execution and the all-gather helpers."""

import gc
import threading
import time

import tensorplay_rpc as rpc
from tensorplay_rpc import api as rpc_api

from .common import add, error_of, init, raise_value_error, rss_kib, wait_until


class Counter:
    """A parameter-server style object kept on its owner."""

    def __init__(self, start=0):
        self.count = start
        self.lock = threading.Lock()

    def increment(self, by=1):
        with self.lock:
            self.count += by
            return self.count

    def value(self):
        return self.count

    def __getstate__(self):
        return {"count": self.count}

    def __setstate__(self, state):
        self.__init__(state["count"])

    @rpc.functions.async_execution
    def increment_later(self, to, by):
        return rpc.rpc_async(to, add, args=(by, 0)).then(lambda f: self.increment(f.wait()))


def value_after(seconds, value):
    time.sleep(seconds)
    return value


def remote_basics(rank, world_size):
    init(rank, world_size)
    out = {}
    if rank == 0:
        rref = rpc.remote("worker1", add, args=(2, 3))
        out["to_here"] = rref.to_here()
        out["owner"] = (rref.owner(), rref.owner_name(), rref.is_owner())
        out["confirmed"] = wait_until(rref.confirmed_by_owner)
        out["local_value_elsewhere"] = error_of(rref.local_value)
        counter = rpc.remote("worker1", Counter, kwargs={"start": 10})
        out["proxy_sync"] = counter.rpc_sync().increment(5)
        out["proxy_async"] = counter.rpc_async().increment(1).wait()
        out["proxy_remote"] = counter.remote().value().to_here()
        # The first async proxy call on a fresh RRef waits for the value's type, then calls:
        # waited for inside a callback that the thread running callbacks runs (no thread waits
        # on the call it follows), it must still end.
        fresh = rpc.remote("worker1", Counter, kwargs={"start": 40})
        from_callback = rpc.Future()

        def use_fresh(_):
            from_callback.set_result(fresh.rpc_async().increment(2).wait())

        rpc.rpc_async("worker1", add, args=(1, 1)).add_done_callback(use_fresh)
        out["proxy_async_in_callback"] = from_callback.wait() if wait_until(from_callback.done, 10) else "stuck"
        out["proxy_async_missing_cached"] = error_of(lambda: counter.rpc_async().missing().wait())
        with rpc.api._wait_all():
            collected = counter.rpc_async().increment(0)
        out["proxy_async_collected"] = collected.done()
        out["proxy_async_method"] = counter.rpc_sync().increment_later("worker0", 100)
        out["counter_here"] = counter.to_here().count
        local = rpc.RRef([1, 2, 3])
        out["local"] = (local.is_owner(), local.owner_name(), local.to_here(), local.local_value() is local.local_value(), local.confirmed_by_owner())
        to_self = rpc.remote("worker0", add, args=("a", "b"))
        out["to_self"] = (to_self.is_owner(), to_self.to_here(), to_self.local_value())
        failed = rpc.remote("worker1", raise_value_error, args=("creation failed 99",))
        out["creation_error_to_here"] = error_of(failed.to_here)
        out["creation_error_proxy"] = error_of(lambda: failed.rpc_sync().anything())
        # Values that came with the creation's confirmation and values fetched: a mutable one
        # changed on its owner after creation is seen changed; the same function twice (the
        # second time the confirmation is awaited first).
        out["inline"] = [rpc.remote("worker1", add, args=((1, "a"), ("b",))).to_here() for _ in range(3)]
        listed = rpc.remote("worker1", list, args=((1, 2),))
        listed.rpc_sync().append(3)
        out["mutable_seen_changed"] = [listed.to_here(), rpc.remote("worker1", list, args=((4,),)).to_here()]
        started = time.monotonic()
        out["to_here_timeout"] = error_of(lambda: rpc.remote("worker1", time.sleep, args=(3,)).to_here(timeout=0.3))
        out["to_here_timeout_took"] = time.monotonic() - started
        # As torch's: a to_here() after the creation's timeout passed raises at once; one that
        # started before fetches the value, which the owner still makes.
        timed_out = rpc.remote("worker1", time.sleep, args=(3,), timeout=0.3)
        time.sleep(0.6)
        started = time.monotonic()
        out["creation_error_timeout"] = error_of(timed_out.to_here)
        out["creation_timeout_took"] = time.monotonic() - started
        out["to_here_during_creation_timeout"] = rpc.remote("worker1", value_after, args=(1, 32), timeout=0.3).to_here()
        # Its creation times out while it waits, and (value_after's last value came with its
        # creation) no fetch went at once: the fetch after has only what is left, yet the
        # error names the timeout to_here() was given.
        assert rpc.remote("worker1", value_after, args=(0, 5)).to_here() == 5
        out["to_here_timeout_named"] = error_of(lambda: rpc.remote("worker1", value_after, args=(3, 7), timeout=0.3).to_here(timeout=0.31))
        out["pickle_outside_rpc"] = error_of(lambda: __import__("pickle").dumps(rref))
        out["repr"] = repr(rref)
        out["unknown"] = error_of(lambda: rpc.remote("nobody", add, args=(1, 2)))
    rpc.shutdown()
    return out


# -- forks: the value kept on worker1, references travelling between all three -------------

_seen_on_owner = {}


def owner_checks(rref, nested):
    """Runs on the owner: every RRef arriving here is the owner's RRef to the same object."""
    value = rref.local_value()
    same = [r.is_owner() and r.local_value() is value for r in (nested["list"][0], nested["list"][1][0], nested["dict"]["r"])]
    return rref.is_owner(), same, value.count


def third_party_uses(rref, nested):
    """Runs on worker2, a user that got the RRef from worker0: use it, pass it on, return it."""
    assert not rref.is_owner() and rref.owner_name() == "worker1"
    rref.rpc_sync().increment(1000)
    inner = [nested["list"][0], nested["list"][1][0], nested["dict"]["r"]]
    back_on_owner = rpc.rpc_sync("worker1", owner_checks, args=(rref, nested))
    return rref, {"again": [rref]}, [r.to_here().count for r in inner], back_on_owner


def make_rref_here(value):
    """Runs on worker2: an RRef it owns, returned to the caller."""
    return rpc.RRef(value)


def forks(rank, world_size):
    init(rank, world_size)
    out = {}
    if rank == 0:
        counter = rpc.remote("worker1", Counter, args=(1,))
        nested = {"list": [counter, (counter,)], "dict": {"r": counter}}
        returned, wrapped, counts, on_owner = rpc.rpc_sync("worker2", third_party_uses, args=(counter, nested))
        out["returned_is_rref"] = isinstance(returned, rpc.RRef) and isinstance(wrapped["again"][0], rpc.RRef)
        out["returned_owner"] = returned.owner_name()
        out["returned_value"] = returned.to_here().count
        out["counts_on_third"] = counts
        out["on_owner"] = on_owner
        del counter, nested, returned, wrapped
        gc.collect()
        owned_by_2 = rpc.rpc_sync("worker2", make_rref_here, args=("kept on worker2",))
        out["owned_by_2"] = (owned_by_2.owner_name(), owned_by_2.to_here())
        del owned_by_2
        gc.collect()
        out["tables_1"] = wait_until(lambda: rpc.rpc_sync("worker1", rpc_api._owned_rref_count) == (0, 0))
        out["tables_2"] = wait_until(lambda: rpc.rpc_sync("worker2", rpc_api._owned_rref_count) == (0, 0))
    rpc.shutdown()
    return out


def refcount_cycles(rank, world_size, cycles):
    """remote() then del, many times: the owner ends with nothing kept and flat memory."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        cycles = int(cycles)
        rss = []
        for i in range(cycles):
            rref = rpc.remote("worker1", add, args=(i, 1))
            if i % 1000 == 999:
                rref.to_here()  # keep the creator from running far ahead of the owner
            del rref
            if i + 1 in (cycles // 5, cycles):
                rpc.rpc_sync("worker1", gc.collect)
                rss.append(rpc.rpc_sync("worker1", rss_kib))
        gc.collect()
        out["emptied"] = wait_until(lambda: rpc.rpc_sync("worker1", rpc_api._owned_rref_count) == (0, 0), timeout=60)
        out["tables"] = rpc.rpc_sync("worker1", rpc_api._owned_rref_count)
        out["rss_kib"] = rss
    rpc.shutdown()
    return out


# -- async_execution ------------------------------------------------------------------------


@rpc.functions.async_execution
def async_add(to, x, y):
    return rpc.rpc_async(to, add, args=(x, y))


@rpc.functions.async_execution
def async_add_chained(to, x, y, z):
    return rpc.rpc_async(to, add, args=(x, y)).then(lambda fut: fut.wait() + z)


@rpc.functions.async_execution
def async_fails():
    fut = rpc.Future()
    fut.set_exception(KeyError("async failure"))
    return fut


class AsyncOps:
    @staticmethod
    @rpc.functions.async_execution
    def static_add(to, x, y):
        return rpc.rpc_async(to, add, args=(x, y))

    @classmethod
    @rpc.functions.async_execution
    def class_add(cls, to, x, y):
        return rpc.rpc_async(to, add, args=(x, y)).then(lambda fut: (cls.__name__, fut.wait()))


_parked = []


@rpc.functions.async_execution
def park():
    """Returns a future that only unpark() completes: the reply waits without a thread."""
    fut = rpc.Future()
    _parked.append(fut)
    return fut


def unpark(value):
    _parked.pop().set_result(value)


def parked_count():
    return len(_parked)


def async_execution(rank, world_size):
    init(rank, world_size, num_worker_threads=1 if rank == 1 else 4)
    out = {}
    if rank == 0:
        out["sync"] = rpc.rpc_sync("worker1", async_add, args=("worker2", 1, 2))
        out["async"] = rpc.rpc_async("worker1", async_add, args=("worker2", 3, 4)).wait()
        out["remote"] = rpc.remote("worker1", async_add, args=("worker2", 5, 6)).to_here()
        out["chained"] = rpc.rpc_sync("worker1", async_add_chained, args=("worker2", 1, 1, 10))
        out["static"] = rpc.rpc_sync("worker1", AsyncOps.static_add, args=("worker2", 7, 8))
        out["static_remote"] = rpc.remote("worker1", AsyncOps.static_add, args=("worker2", 1, 8)).to_here()
        out["class"] = rpc.rpc_async("worker1", AsyncOps.class_add, args=("worker2", 9, 10)).wait()
        out["fails"] = error_of(lambda: rpc.rpc_sync("worker1", async_fails))
        parked = rpc.rpc_async("worker1", park)
        deadline = time.monotonic() + 10
        while rpc.rpc_sync("worker1", parked_count) == 0:  # park's future is in place
            assert time.monotonic() < deadline, "park never ran on worker1"
        # worker1 has one thread; unpark can only run if park does not hold it.
        rpc.rpc_sync("worker1", unpark, args=("unparked",), timeout=10)
        out["parked"] = parked.wait()
    rpc.shutdown()
    return out


# -- futures and collectives ----------------------------------------------------------------


def futures_and_gather(rank, world_size):
    init(rank, world_size)
    out = {}
    order = []
    fut = rpc.rpc_async(f"worker{(rank + 1) % world_size}", add, args=(rank, 1))
    chain = fut.then(lambda f: order.append("then1") or f.wait() * 2).then(lambda f: order.append("then2") or f.wait() + 1)
    callback_ran = threading.Event()
    fut.add_done_callback(lambda f: (order.append("callback"), callback_ran.set()))
    out["chain"] = chain.wait()
    callback_ran.wait(10)
    out["order"] = order
    failing = rpc.rpc_async(f"worker{(rank + 1) % world_size}", add, args=(1, 1)).then(lambda f: 1 / 0)
    out["then_error"] = error_of(failing.wait)
    futs = [rpc.rpc_async(f"worker{i}", add, args=(i, 100)) for i in range(world_size)]
    out["collect_all"] = [f.value() for f in rpc.collect_all(futs).wait()]
    out["wait_all"] = rpc.wait_all([rpc.rpc_async(f"worker{i}", add, args=(i, 1)) for i in range(world_size)])
    out["all_gather"] = rpc_api._all_gather(rank * 10)
    out["all_gather_again"] = rpc_api._all_gather(f"r{rank}")
    evens = {f"worker{i}" for i in range(0, world_size, 2)}
    if f"worker{rank}" in evens:
        out["subset"] = rpc_api._all_gather(rank, worker_names=evens)
    rpc_api._barrier({f"worker{i}" for i in range(world_size)})
    # A worker that never comes: the wait of a leader (worker0, for worker2) and of a follower
    # (worker1, for worker0) ends at its timeout, with an error.
    partner = {0: "worker2", 1: "worker0"}.get(rank)
    if partner:
        start = time.monotonic()
        out["gather_timeout"] = error_of(lambda: rpc_api._all_gather(rank, worker_names={f"worker{rank}", partner}, timeout=1.0))
        out["gather_timeout_took"] = time.monotonic() - start
    rpc_api._barrier({f"worker{i}" for i in range(world_size)})
    out["states"] = type(rpc.AllGatherStates().proceed_signal).__name__
    rpc.shutdown()
    return out


def shutdown_with_rrefs(rank, world_size):
    """Graceful shutdown with RRefs still held and deletions pending returns; used afterwards,
    a user RRef raises even if its value came cached with its creation. As torch's, it deletes
    the user RRefs still held: their owner drops the values before it closes (the caller's
    own RRefs, small and held, included)."""
    init(rank, world_size)
    held, out = [], {}
    tracked = []
    if rank == 0:
        tracked = [rpc.remote("worker1", Counter) for _ in range(20)]
        [r.to_here() for r in tracked]
    if rank == 0:
        held = [rpc.remote("worker1", Counter, args=(i,)) for i in range(50)]
        for i in range(50):
            rpc.remote("worker1", Counter, args=(i,))  # dropped at once: releases in flight
        small = rpc.remote("worker1", add, args=(40, 1))
        out["small_before"] = small.to_here()
        out["bad_timeout"] = error_of(lambda: rpc.shutdown(timeout="x"))
        out["still_up"] = rpc.rpc_sync("worker1", add, args=(1, 2))
    # Kept: the agent's table of owned values dies with it, values and all, whether or not
    # their owner heard of their release.
    agent = rpc._get_current_rpc_agent()
    start = time.monotonic()
    rpc.shutdown()
    out["took"] = time.monotonic() - start
    out["held"] = len(held)
    if rank == 0:
        out["small_after"] = error_of(small.to_here)
        out["tracked_held"] = len(tracked)
    else:
        # What the owner's Go agent still tracks: forks nobody released (its Python side no
        # longer hears of drops once it has shut down).
        out["owned_after"] = agent._go_agent.OwnedRRefs()
    del agent
    return out


# -- backends and init methods --------------------------------------------------------------


def custom_backend(rank, world_size):
    calls = []

    def construct(rpc_timeout, init_method, **kwargs):
        calls.append("construct")
        return rpc.construct_rpc_backend_options(rpc.BackendType.TENSORPIPE, rpc_timeout, init_method, **kwargs)

    def start(store, name, rank, world_size, rpc_backend_options):
        calls.append(("init", name, rank, world_size))
        return rpc.init_backend(
            rpc.BackendType.TENSORPIPE, store=store, name=name, rank=rank, world_size=world_size, rpc_backend_options=rpc_backend_options
        )

    backend = rpc.register_backend("CUSTOM", construct, start)
    out = {"member": (repr(backend), rpc.BackendType.CUSTOM is backend, rpc.backend_registered("CUSTOM"))}
    out["duplicate"] = error_of(lambda: rpc.register_backend("CUSTOM", construct, start))
    rpc.init_rpc(f"worker{rank}", backend=backend, rank=rank, world_size=world_size)
    out["call"] = rpc.rpc_sync(f"worker{(rank + 1) % world_size}", add, args=(rank, 1))
    rpc.shutdown()
    out["calls"] = calls
    return out


def file_init(rank, world_size, path):
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{path}")
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
    got = rpc.rpc_sync(f"worker{(rank + 1) % world_size}", add, args=(rank, 10))
    rpc.shutdown()
    return got


def refused_send_with_an_rref(rank, world_size):
    """An RRef passed in a call refused before it leaves (over the size limit) registers no fork
    for good: the would-be holder never hears of it, so the owner drops the value once the
    caller drops its RRef (it kept it until the holder left)."""
    import numpy as np

    init(rank, world_size, max_message_size=1 << 20)
    out = {}
    if rank == 0:
        rref = rpc.remote("worker1", Counter, args=(7,))
        rref.to_here()
        out["refused"] = error_of(lambda: rpc.rpc_sync("worker2", add, args=(rref, np.zeros(2 << 20, dtype=np.uint8))))
        out["owned_while_held"] = rpc.rpc_sync("worker1", rpc_api._owned_rref_count)
        del rref
        gc.collect()
        out["emptied"] = wait_until(lambda: rpc.rpc_sync("worker1", rpc_api._owned_rref_count) == (0, 0), timeout=10)
    rpc.shutdown()
    return out

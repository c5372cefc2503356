"""Scenarios for calls, worker look-ups, errors and timeouts."""

import os
import sys
import threading
import time

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent

from .common import ForgedRRef, add, error_of, init, raise_custom, raise_value_error, sleeping_now, slow, track_concurrency, max_concurrency, whoami


def all_to_all(rank, world_size):
    """Every worker calls every worker, itself included, by name, id and WorkerInfo."""
    init(rank, world_size)
    got = {}
    for peer in range(world_size):
        name = f"worker{peer}"
        info = rpc.get_worker_info(name)
        got[name] = (
            rpc.rpc_sync(name, add, args=(rank, peer)),
            rpc.rpc_sync(peer, add, args=(rank, 10)),
            rpc.rpc_sync(info, add, kwargs={"a": rank, "b": 100}),
            rpc.rpc_async(name, whoami).wait(),
            rpc.rpc_sync(name, add, args=("x", "y")),
        )
    rpc.shutdown()
    return got


def worker_infos(rank, world_size):
    init(rank, world_size)
    me = rpc.get_worker_info()
    infos = [rpc.get_worker_info(f"worker{i}") for i in range(world_size)]
    out = {
        "me": (me.name, me.id, repr(me), str(me)),
        "all": [(w.name, w.id) for w in infos],
        "equal": rpc.get_worker_info(f"worker{rank}") == me,
        "hash": hash(rpc.get_worker_info(f"worker{rank}")) == hash(me),
        "distinct": len(set(infos)) == world_size,
        "timeout": rpc.get_rpc_timeout(),
    }
    rpc.shutdown()
    return out


def errors(rank, world_size):
    init(rank, world_size)
    out = {}
    if rank == 0:
        out["value_error"] = error_of(lambda: rpc.rpc_sync("worker1", raise_value_error, args=("bad value 17",)))
        out["value_error_async"] = error_of(lambda: rpc.rpc_async("worker1", raise_value_error, args=("async 18",)).wait())
        out["custom"] = error_of(lambda: rpc.rpc_sync("worker1", raise_custom))
        out["bad_args"] = error_of(lambda: rpc.rpc_sync("worker1", add, args=(1,)))
        out["unknown_name"] = error_of(lambda: rpc.rpc_sync("nobody", add, args=(1, 2)))
        out["unknown_id"] = error_of(lambda: rpc.rpc_sync(7, add, args=(1, 2)))
        out["unknown_info"] = error_of(lambda: rpc.rpc_sync(rpc.WorkerInfo("ghost", 1), add, args=(1, 2)))
        out["unknown_info_lookup"] = error_of(lambda: rpc.get_worker_info("nobody"))
        # The API refuses unknown destinations itself; past it, Go's verdict maps the same way.
        call = _agent.function_call(add, (1, 2), None)
        out["unknown_in_go"] = error_of(lambda: _agent.require_agent().rpc_sync(rpc.WorkerInfo("ghost", 7), call, -1))
        out["not_callable"] = error_of(lambda: rpc.rpc_sync("worker1", 42))
        out["bad_to"] = error_of(lambda: rpc.rpc_sync(3.5, add, args=(1, 2)))
        out["unpicklable_arg"] = error_of(lambda: rpc.rpc_sync("worker1", add, args=(threading.Lock(), 1)))
        out["forged_rref_owner"] = error_of(lambda: rpc.rpc_sync("worker1", add, args=(ForgedRRef(99), 1)))
        out["forged_rref_id"] = error_of(lambda: rpc.rpc_sync("worker1", add, args=(ForgedRRef(0, (0, 1 << 70)), 1)))
        out["second_init"] = error_of(lambda: init(rank, world_size))
        out["still_serving"] = rpc.rpc_sync("worker1", add, args=(1, 2))
    rpc.shutdown()
    return out


def timeouts(rank, world_size):
    init(rank, world_size, rpc_timeout=1.0)
    out = {}
    if rank == 0:

        def timed(fn):
            start = time.monotonic()
            err = error_of(fn)
            return err, time.monotonic() - start

        out["explicit"] = timed(lambda: rpc.rpc_sync("worker1", slow, args=(5,), timeout=0.3))
        out["explicit_async"] = timed(lambda: rpc.rpc_async("worker1", slow, args=(5,), timeout=0.3).wait())
        out["default"] = timed(lambda: rpc.rpc_sync("worker1", slow, args=(5,)))
        out["none"] = rpc.rpc_sync("worker1", slow, args=(1.5,), timeout=0)
        out["still_serving"] = rpc.rpc_sync("worker1", add, args=(2, 3))
        out["timeout"] = rpc.get_rpc_timeout()
    rpc.shutdown()
    return out


def thread_pool(rank, world_size):
    """The callee runs calls on num_worker_threads threads, and a caller blocked in a call
    leaves the GIL to its other threads."""
    init(rank, world_size, num_worker_threads=3)
    out = {}
    if rank == 0:
        futs = [rpc.rpc_async("worker1", track_concurrency, args=(0.4,)) for _ in range(7)]
        out["threads"] = sorted({f.wait() for f in futs})
        out["max_concurrency"] = rpc.rpc_sync("worker1", max_concurrency)

        # Python switches threads only when one blocks: a thread can then run during the
        # call only if the caller left the GIL while it waited. (With the default 5 ms switch
        # interval a spinner runs even beside a thread that holds the GIL.)
        go = threading.Event()
        spun = []  # (when the spinner began, spins) once it has spun

        def spin():
            go.wait()
            began = time.monotonic()
            spins = 0
            while time.monotonic() - began < 0.3:
                spins += 1
            spun.append((began, spins))

        t = threading.Thread(target=spin)
        t.start()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(60.0)
        try:
            go.set()
            called = time.monotonic()
            rpc.rpc_sync("worker1", slow, args=(1.0,))
            returned = time.monotonic()
        finally:
            sys.setswitchinterval(interval)
        t.join()
        began, spins = spun[0]
        out["spinner_ran_during_the_call"] = called <= began < returned and spins > 1000
    rpc.shutdown()
    return out


def callbacks(rank, world_size):
    """Callbacks on rpc_async futures run though no thread waits on the futures (the event
    thread completes them), and a thread waiting on one still runs its callbacks."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        ran = threading.Event()
        seen = []
        fut = rpc.rpc_async("worker1", add, args=(2, 3))
        fut.add_done_callback(lambda f: (seen.append(f.value()), ran.set()))
        out["callback_alone"] = (ran.wait(10), seen)
        done = threading.Event()
        chained = rpc.rpc_async("worker1", slow, args=(0.2,)).then(lambda f: done.set() or "chained")
        out["then_alone"] = (done.wait(10), chained.wait())
        failed = threading.Event()
        errs = []

        def on_error(f):
            errs.append(error_of(f.value)[0].__name__)
            failed.set()

        rpc.rpc_async("worker1", raise_value_error, args=("in a callback 7",)).add_done_callback(on_error)
        out["error_alone"] = (failed.wait(10), errs)
        # wait() may return before the callbacks ran (they run on another thread, as torch's).
        waited = []
        waited_ran = threading.Event()
        fut = rpc.rpc_async("worker1", slow, args=(0.2,))
        fut.add_done_callback(lambda f: (waited.append(f.value()), waited_ran.set()))
        out["waited"] = (fut.wait(), waited_ran.wait(10), waited)
        # A callback that waits on a nested call and its own callbacks, on the thread that runs
        # callbacks (nobody waits on the outer future).
        nested_done = threading.Event()
        nested = []

        def nested_callback(f):
            inner = rpc.rpc_async("worker1", add, args=(f.value(), 10)).then(lambda g: g.value() * 2)
            nested.append(inner.wait())
            nested_done.set()

        rpc.rpc_async("worker1", add, args=(1, 2)).then(nested_callback)
        out["nested"] = (nested_done.wait(10), nested)
        # A callback raising SystemExit: the next callbacks run, and so do later futures'.
        after_exit = []
        fut = rpc.rpc_async("worker1", add, args=(1, 1))
        fut.add_done_callback(lambda f: sys.exit(3))
        fut.add_done_callback(lambda f: after_exit.append(f.value()))
        later = threading.Event()
        rpc.rpc_async("worker1", add, args=(2, 2)).add_done_callback(lambda f: later.set())
        out["after_exit"] = (later.wait(10), after_exit)
        out["pending_after"] = _agent.current_agent().pending_futures()
    rpc.shutdown()
    return out


def callbacks_off_the_waiter(rank, world_size):
    """Callbacks of rpc_async futures run on library threads, as torch's: never inside the
    wait() or done() of the thread waiting on the future, and a callback that blocks holds up
    no other future's callbacks. Every wait is bounded, so a deadlock shows as False."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        me = threading.get_ident()
        lock = threading.Lock()

        def takes_the_lock(seen):
            def callback(f):
                took = lock.acquire(timeout=5)  # the waiter holds it: 5 s means a deadlock
                if took:
                    lock.release()
                seen.append((took, threading.get_ident() != me))
            return callback

        # The waiter holds a lock the callback takes, in wait(), done(), wait_all and then().
        for how in ("wait", "done", "wait_all", "then"):
            seen = []
            fut = rpc.rpc_async("worker1", slow, args=(0.2,))
            if how == "then":
                chained = fut.then(takes_the_lock(seen))
            else:
                fut.add_done_callback(takes_the_lock(seen))
            with lock:
                if how == "done":
                    while not fut.done():
                        time.sleep(0.01)
                elif how == "wait_all":
                    rpc.futures.wait_all([fut])
                else:
                    fut.wait()
            if how == "then":
                chained.wait()
            else:
                _wait_for(lambda: seen, 10)
            out[f"lock_held_in_{how}"] = seen

        # A callback blocked until released must not stop another future's callbacks, whether
        # the event thread or a waiting thread completes the futures.
        for waited in (False, True):
            release, b_ran, a_started = threading.Event(), threading.Event(), threading.Event()
            fa = rpc.rpc_async("worker1", slow, args=(0.1,))
            fb = rpc.rpc_async("worker1", slow, args=(0.3,))
            fa.add_done_callback(lambda f: (a_started.set(), release.wait(20)))
            fb.add_done_callback(lambda f: b_ran.set())
            if waited:
                fa.wait()
                fb.wait()
            out[f"blocked_callback_blocks_no_other_{'waited' if waited else 'alone'}"] = (
                a_started.wait(10), b_ran.wait(10), not release.is_set())
            release.set()

        # 20 callbacks that each block until all 20 run at once (torch's 16 threads would not).
        barrier = threading.Barrier(20, timeout=20)
        met = []
        futs = [rpc.rpc_async("worker1", add, args=(i, 0)) for i in range(20)]
        for f in futs:
            f.add_done_callback(lambda f: met.append(barrier.wait() >= 0))
        _wait_for(lambda: len(met) == 20 or barrier.broken, 30)
        out["twenty_blocked_callbacks_run_at_once"] = (len(met), barrier.broken)

        # Order: a callback added while the earlier ones still run goes after them.
        order, first_started, go_on = [], threading.Event(), threading.Event()
        fut = rpc.rpc_async("worker1", add, args=(1, 1))
        fut.add_done_callback(lambda f: (first_started.set(), go_on.wait(10), order.append(1)))
        fut.wait()
        first_started.wait(10)
        fut.add_done_callback(lambda f: order.append(2))
        go_on.set()
        _wait_for(lambda: len(order) == 2, 10)
        out["order"] = order

        # then() on a complete future whose callbacks have run: at once, on this thread, as torch.
        fut = rpc.rpc_async("worker1", add, args=(2, 2))
        fut.wait()
        settled = threading.Event()
        fut.add_done_callback(lambda f: settled.set())
        settled.wait(10)
        here = []
        chained = fut.then(lambda f: here.append(threading.get_ident() == me) or f.value())
        out["then_on_complete_future"] = (here, chained.wait())

        # As torch's, shutdown returns once the callbacks of completed calls have run.
        late = []
        rpc.rpc_async("worker1", slow, args=(0.2,)).add_done_callback(lambda f: (time.sleep(0.5), late.append(f.value())))
    rpc.shutdown()
    if rank == 0:
        out["callback_ran_before_shutdown_returned"] = late
    return out


def _wait_for(cond, seconds):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(cond())


def env_only(rank, world_size):
    """init_rpc with nothing but a name: rank and world size come from RANK and WORLD_SIZE."""
    rpc.init_rpc(f"env{rank}")
    me = rpc.get_worker_info()
    peer = rpc.rpc_sync(f"env{(rank + 1) % world_size}", whoami)
    rpc.shutdown()
    return me.name, me.id, peer


def graceful_shutdown(rank, world_size):
    """Every worker but the last calls shutdown at once; the last first makes a slow call to
    worker0 and shuts down without waiting for it: the call must still complete."""
    init(rank, world_size)
    out = {}
    if rank == world_size - 1:
        fut = rpc.rpc_async("worker0", slow, args=(1.5,))
        rpc.shutdown()
        out["slow_result"] = fut.wait()
    else:
        start = time.monotonic()
        rpc.shutdown()
        out["waited"] = time.monotonic() - start
    out["after"] = error_of(lambda: rpc.rpc_sync("worker0", add, args=(1, 2)))
    out["second_shutdown"] = error_of(rpc.shutdown)
    return out


def reinit(rank, world_size, port2):
    """A worker can shut down and join a new world."""
    init(rank, world_size)
    first = rpc.rpc_sync(f"worker{(rank + 1) % world_size}", add, args=(1, 1))
    rpc.shutdown()
    os.environ["MASTER_PORT"] = port2
    init(rank, world_size)
    second = rpc.rpc_sync(f"worker{(rank + 1) % world_size}", add, args=(2, 2))
    rpc.shutdown()
    return first, second


def non_graceful(rank, world_size):
    """Non-graceful shutdown returns at once and fails this worker's pending calls."""
    init(rank, world_size)
    if rank == 1:
        # Leave only once worker0 has shut down (a call to it then fails), so that its pending
        # call fails for its own shutdown, not for this worker leaving first.
        deadline = time.monotonic() + 30
        while error_of(lambda: rpc.rpc_sync("worker0", add, args=(1, 1), timeout=5)) == (None, None):
            assert time.monotonic() < deadline, "worker0 did not shut down within 30 s"
            time.sleep(0.02)
        rpc.shutdown(graceful=False)
        return None
    fut = rpc.rpc_async("worker1", slow, args=(30,))
    # The call is running on worker1 (its stream is open) before this worker shuts down: a
    # call still dialing when worker1 leaves would fail for worker1 being gone instead.
    deadline = time.monotonic() + 30
    while rpc.rpc_sync("worker1", sleeping_now) < 1:
        assert time.monotonic() < deadline, "the call never ran on worker1"
        time.sleep(0.01)
    start = time.monotonic()
    rpc.shutdown(graceful=False)
    took = time.monotonic() - start
    return took, error_of(fut.wait)


def metrics(rank, world_size):
    """Worker 0 makes six calls to worker 1 and reads its own metrics; worker 1 reads what it
    served once an all-gather (one more call from worker 0) says worker 0 is done."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        for i in range(4):
            rpc.rpc_sync("worker1", add, args=(i, 1))
        error_of(lambda: rpc.rpc_sync("worker1", raise_value_error, args=("counted",)))
        error_of(lambda: rpc.rpc_sync("worker1", slow, args=(1,), timeout=0.1))
        snapshot = rpc.metrics()
        rpc.api._all_gather(None)
    else:
        rpc.api._all_gather(None)
        snapshot = rpc.metrics()
    peer = {p["name"]: p for p in snapshot["peers"]}["worker1" if rank == 0 else "worker0"]
    out = {k: peer[k] for k in ("calls_sent", "calls_served", "in_flight")}
    out["errors"] = {k: v for k, v in peer["errors"].items() if v}
    out["has_latency"] = sorted(peer["latency_us"])
    out["bytes_positive"] = peer["bytes_sent"] > 0 and peer["bytes_received"] > 0
    out["keys"] = sorted(snapshot)
    rpc.shutdown()
    return out


def torch_waits(rank, world_size):
    """torch imported before init_rpc: the futures of calls are torch futures, whose torch state
    is filled only once torch looks. torch's own waits (wait_all and collect_all through
    torch._C._collect_all, torch.jit.wait through torch._C.wait) tell the futures first, even
    when imported from torch before init_rpc, and get their values, whether the calls are still
    under way or long complete; no thread of ours waits on any of them."""
    import torch
    from torch.futures import collect_all as torch_collect_all
    from torch.futures import wait_all as torch_wait_all
    from torch.jit import wait as jit_wait

    init(rank, world_size)
    out = {}
    if rank == 0:
        futs = [rpc.rpc_async("worker1", add, args=(i, 100)) for i in range(64)]
        out["wait_all"] = torch_wait_all(futs)
        collected = torch_collect_all([rpc.rpc_async("worker1", add, args=(i, 200)) for i in range(8)])
        out["collect_all"] = [f.value() for f in collected.wait()]
        out["jit_wait"] = jit_wait(rpc.rpc_async("worker1", add, args=(1, 2)))
        # Complete long before torch looks: no one settled them, and nothing is lost.
        done_before = [rpc.rpc_async("worker1", add, args=(i, 300)) for i in range(8)]
        time.sleep(0.5)
        out["torch_state_before_looking"] = sum(torch._C.Future.done(f) for f in done_before)
        out["wait_all_late"] = torch_wait_all(done_before)
        out["is_torch_future"] = isinstance(done_before[0], torch.futures.Future)
    rpc.shutdown()
    return out


def idle_after_burst(rank, world_size):
    """Both workers call each other in bursts (sync, async, RRefs), then idle: readers poll only
    right after a frame, so the idle seconds cost almost no CPU. Returns this worker's CPU
    seconds over 2 idle seconds."""
    init(rank, world_size)
    peer = f"worker{1 - rank}"
    for _ in range(200):
        rpc.rpc_sync(peer, add, args=(1, 2))
    for f in [rpc.rpc_async(peer, add, args=(i, 1)) for i in range(256)]:
        f.wait()
    rpc.remote(peer, add, args=(3, 4)).to_here()
    rpc.rpc_sync(peer, add, args=(0, 0))  # both sides are done before either measures
    # A reply no thread waits for is read by the stream's reader goroutine, which then polls.
    last = rpc.rpc_async(peer, add, args=(5, 6))
    time.sleep(0.1)
    last.wait()
    time.sleep(0.2)
    before = time.process_time()
    time.sleep(2.0)
    used = time.process_time() - before
    rpc.shutdown()
    return used

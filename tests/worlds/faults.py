"""Scenarios where the world cannot form or a worker dies."""

import os
import threading
import time

import numpy as np

import tensorplay_rpc as rpc

from .common import Sleeper, add, error_of, init, options, set_done, shm_mappings, sleeping_now, slow, wait_done, wait_for_file


def try_init(rank, world_size, name=None, rank_override=None, rpc_timeout="3"):
    """Try to join; return the error type and message, or None if the world formed."""
    start = time.monotonic()
    try:
        rpc.init_rpc(
            name or f"worker{rank}",
            rank=int(rank_override) if rank_override is not None else rank,
            world_size=world_size,
            rpc_backend_options=options(rpc_timeout=float(rpc_timeout)),
        )
    except Exception as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    rpc.shutdown(graceful=False)
    return None


def duplicate_name(rank, world_size):
    return try_init(rank, world_size, name="same")


def rank_out_of_range(rank, world_size):
    return try_init(rank, world_size, rank_override=5 if rank == 1 else None)


def missing_worker(rank, world_size):
    return try_init(rank, world_size, rpc_timeout="2")


def bad_name(rank, world_size):
    return try_init(rank, world_size, name="bad name!")


def peer_dies(rank, world_size, ready_file):
    """worker0 waits on calls to worker1, which the test then kills by PID."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        futs = [rpc.rpc_async("worker1", slow, args=(60,)) for _ in range(3)]
        sleeper = rpc.remote("worker1", Sleeper)
        blocked = {
            "rpc_sync": lambda: rpc.rpc_sync("worker1", slow, args=(60,)),
            "to_here": lambda: rpc.remote("worker1", slow, args=(60,)).to_here(),
            "proxy": lambda: sleeper.rpc_sync().sleep(60),
        }
        outcomes = {}

        def run_blocked(name, fn):
            try:
                fn()
                outcomes[name] = None
            except RuntimeError as exc:
                outcomes[name] = str(exc)
            outcomes[name + "_at"] = time.monotonic()

        threads = [threading.Thread(target=run_blocked, args=item) for item in blocked.items()]
        for t in threads:
            t.start()
        # Every call is running on worker1 (3 futures, and one call per blocked thread) before
        # worker1 is killed.
        deadline = time.monotonic() + 30
        while rpc.rpc_sync("worker1", sleeping_now) < len(futs) + len(blocked):
            assert time.monotonic() < deadline, "the blocked calls never all ran on worker1"
            time.sleep(0.02)
        rpc.rpc_sync("worker2", add, args=(1, 1))
        out["mapped_while_calling"] = shm_mappings()
        with open(ready_file, "w") as f:
            f.write("ready")
        errors = []
        start = time.monotonic()
        for f in futs:
            try:
                f.wait()
                errors.append(None)
            except RuntimeError as exc:
                errors.append(str(exc))
        for t in threads:
            t.join(timeout=30)
        out["waited"] = max([time.monotonic() - start] + [outcomes.get(k + "_at", 1e9) - start for k in blocked])
        out["blocked"] = {k: outcomes.get(k) for k in blocked}
        out["errors"] = errors
        try:
            rpc.rpc_sync("worker1", add, args=(1, 1))
            out["new_call"] = None
        except RuntimeError as exc:
            out["new_call"] = str(exc)
        out["survivor"] = rpc.rpc_sync("worker2", add, args=(2, 2))
        rpc.rpc_sync("worker2", set_done)
        start = time.monotonic()
        rpc.shutdown()  # graceful: must not wait for the dead worker
        out["shutdown_took"] = time.monotonic() - start
        out["mapped_after_shutdown"] = shm_mappings()
    elif rank == 1:
        time.sleep(120)  # killed by the test long before this
    else:
        wait_done(60)
        rpc.shutdown()
    return out


_big_received = [0]
_big_received_lock = threading.Lock()


def _sum_first(arr):
    """Counts a big array received and sums its first bytes."""
    with _big_received_lock:
        _big_received[0] += 1
    return int(arr[:16].sum())


def _received():
    """How many big arrays this worker has received."""
    with _big_received_lock:
        return _big_received[0]


def _stream_big(to, nbytes, futs):
    """Sends arrays of nbytes to `to` back to back, two in flight, until a call fails (at most 1000)."""
    arr = np.ones(nbytes, dtype=np.uint8)
    while len(futs) < 1000:
        futs.append(rpc.rpc_async(to, _sum_first, args=(arr,)))
        if len(futs) >= 2:
            try:
                futs[-2].wait()
            except RuntimeError:
                return


def peer_dies_mid_transfer(rank, world_size, ready_file, nbytes):
    """worker0 and worker1 send each other big arrays back to back (over shared memory, each
    reads the other's memory) until the test kills worker1 by PID, mid-transfer."""
    init(rank, world_size)
    nbytes = int(nbytes)
    out = {}
    if rank == 0:
        futs = []
        sender = threading.Thread(target=_stream_big, args=("worker1", nbytes, futs))
        sender.start()
        deadline = time.monotonic() + 30
        while rpc.rpc_sync("worker1", _received) < 4 or _received() < 4:
            assert time.monotonic() < deadline, "the transfers never got going"
            time.sleep(0.02)
        with open(ready_file, "w") as f:
            f.write("ready")
        start = time.monotonic()
        sender.join(timeout=30)
        errors = []
        for f in futs:
            try:
                f.wait()
            except RuntimeError as exc:
                errors.append(str(exc))
        out["waited"] = time.monotonic() - start
        out["sender_ended"] = not sender.is_alive()
        out["errors"] = errors
        out["completed"] = len(futs) - len(errors)
        out["survivor"] = rpc.rpc_sync("worker2", add, args=(2, 2))
        out["big_to_survivor"] = rpc.rpc_sync("worker2", _sum_first, args=(np.ones(nbytes, dtype=np.uint8),))
        rpc.rpc_sync("worker2", set_done)
        rpc.shutdown()
        out["mapped_after_shutdown"] = shm_mappings()
    elif rank == 1:
        _stream_big("worker0", nbytes, [])  # killed by the test while at it
    else:
        wait_done(60)
        rpc.shutdown()
    return out


def peer_frozen(rank, world_size, ready_file, frozen_file):
    """worker1 is frozen by the test (SIGSTOP, then SIGCONT some seconds later): a loaded or
    paused host is not a dead one. Calls to it wait and complete once it runs again, the RRef
    it owns survives, and calls to the others go on meanwhile."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        owned = rpc.remote("worker1", add, args=(20, 22))
        out["before"] = owned.to_here()
        rpc.rpc_sync("worker2", add, args=(1, 1))
        with open(ready_file, "w") as f:
            f.write("ready")
        wait_for_file(frozen_file, 30)
        start = time.monotonic()
        fut = rpc.rpc_async("worker1", add, args=(2, 3), timeout=60)
        out["survivor"] = rpc.rpc_sync("worker2", add, args=(2, 2))
        out["survivor_took"] = time.monotonic() - start
        out["frozen_call"] = fut.wait()
        out["frozen_call_took"] = time.monotonic() - start
        out["after"] = owned.to_here()
        out["new_call"] = rpc.rpc_sync("worker1", add, args=(3, 4))
        del owned
    rpc.shutdown()
    return out


def big_call_to_frozen(rank, world_size, ready_file, frozen_file, failed_file, nbytes):
    """worker1 is frozen by the test (SIGSTOP) before worker0 sends it a big array with a
    2-second timeout, and thawed once that call has failed: the call fails in bounded time,
    though worker1 never read the array (over shared memory it would read it from worker0's
    memory, which worker0 gets back), and worker1 answers calls again, big ones included,
    once it runs."""
    init(rank, world_size)
    nbytes = int(nbytes)
    out = {}
    if rank == 0:
        arr = np.ones(nbytes, dtype=np.uint8)
        out["before"] = rpc.rpc_sync("worker1", _sum_first, args=(arr,))
        with open(ready_file, "w") as f:
            f.write("ready")
        wait_for_file(frozen_file, 30)
        start = time.monotonic()
        fut = rpc.rpc_async("worker1", _sum_first, args=(arr,), timeout=2)
        out["survivor"] = rpc.rpc_sync("worker2", add, args=(2, 2))
        _, out["error"] = error_of(fut.wait)
        out["failed_after"] = time.monotonic() - start
        arr[:] = 2  # the memory is ours again
        with open(failed_file, "w") as f:
            f.write("failed")
        out["after"] = rpc.rpc_sync("worker1", _sum_first, args=(arr,), timeout=30)
        rpc.rpc_sync("worker2", set_done)
        rpc.rpc_sync("worker1", set_done)
    else:
        wait_done(120)
    rpc.shutdown()
    return out


def frozen_past_peer_timeout(rank, world_size, ready_file, frozen_file, failed_file, thawed_file, nbytes):
    """worker1 is frozen by the test (SIGSTOP) for longer than the peer timeout, and thawed once
    worker0's calls to it have failed: calls without a timeout (a small one, and a big array
    whose memory the frozen worker may still have to read) fail once the peer timeout has
    passed, naming it, on every transport; worker0 gets its array's memory back, and worker1
    answers again once it runs."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        arr = np.ones(int(nbytes), dtype=np.uint8)
        out["before"] = rpc.rpc_sync("worker1", _sum_first, args=(arr,))
        with open(ready_file, "w") as f:
            f.write("ready")
        wait_for_file(frozen_file, 30)
        start = time.monotonic()
        small = rpc.rpc_async("worker1", add, args=(2, 3), timeout=0)
        big = rpc.rpc_async("worker1", _sum_first, args=(arr,), timeout=0)
        out["survivor"] = rpc.rpc_sync("worker2", add, args=(2, 2))
        _, out["small_error"] = error_of(small.wait)
        _, out["big_error"] = error_of(big.wait)
        out["failed_after"] = time.monotonic() - start
        arr[:] = 2  # the memory is ours again
        with open(failed_file, "w") as f:
            f.write("failed")
        wait_for_file(thawed_file, 30)
        out["after"] = rpc.rpc_sync("worker1", _sum_first, args=(arr,), timeout=30)
        out["small_after"] = rpc.rpc_sync("worker1", add, args=(3, 4), timeout=30)
        rpc.rpc_sync("worker2", set_done)
        rpc.rpc_sync("worker1", set_done)
    else:
        wait_done(180)
    rpc.shutdown()
    return out


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shutdown_timeout(rank, world_size):
    """worker1 does not shut down for a while: worker0's graceful shutdown waits for it until
    its timeout, then leaves without it and returns, as torch's does (saying whom it left), and
    this worker is shut down whole: a new world can start on it at once."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        start = time.monotonic()
        try:
            rpc.shutdown(timeout=1.5)
            out["error"] = None
        except RuntimeError as err:
            out["error"] = str(err)
        out["took"] = time.monotonic() - start
        out["agent_left"] = not rpc._is_current_rpc_agent_set()
        out["threads_left"] = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and "tensorplay" in t.name.lower())
        # A world of one on a fresh port: nothing of the old agent is in the way.
        rpc.init_rpc("solo", rank=0, world_size=1, rpc_backend_options=options(init_method=f"tcp://127.0.0.1:{_free_port()}"))
        out["solo"] = rpc.rpc_sync("solo", add, args=(1, 2))
        rpc.shutdown()
    else:
        time.sleep(5)
        rpc.shutdown(graceful=False)
    return out


def missing_master_addr(rank, world_size):
    del os.environ["MASTER_ADDR"]
    try:
        rpc.init_rpc("w", rank=0, world_size=1)
    except ValueError as exc:
        return str(exc)
    return None


def store_host_dies(rank, world_size, ready_dir):
    """The test kills worker0 (the store's host); the others still shut down gracefully."""
    init(rank, world_size)
    with open(os.path.join(ready_dir, f"ready{rank}"), "w") as f:
        f.write("ready")
    if rank == 0:
        time.sleep(120)  # killed by the test long before this
        return None
    killed = os.path.join(ready_dir, "killed")
    deadline = time.monotonic() + 30
    while not os.path.exists(killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    other = "worker2" if rank == 1 else "worker1"
    got = rpc.rpc_sync(other, add, args=(rank, 1))
    # With no store there is no barrier: the survivors wait for each other's call by hand.
    with open(os.path.join(ready_dir, f"called{rank}"), "w") as f:
        f.write("called")
    while not all(os.path.exists(os.path.join(ready_dir, f"called{r}")) for r in (1, 2)):
        if time.monotonic() > deadline:
            raise TimeoutError("the other survivor never made its call")
        time.sleep(0.02)
    start = time.monotonic()
    rpc.shutdown()
    return got, time.monotonic() - start


def token_world(rank, world_size, given_as):
    """Joins with the token the test set in WORLD_TOKEN, given as TENSORPLAY_RPC_TOKEN
    (given_as "env") or as TensorPipeRpcBackendOptions(token=...) ("option")."""
    token = os.environ["WORLD_TOKEN"]
    if given_as == "env":
        os.environ["TENSORPLAY_RPC_TOKEN"] = token
    try:
        init(rank, world_size, rpc_timeout=3, **({"token": token} if given_as == "option" else {}))
    except RuntimeError as exc:
        return "refused", str(exc)
    got = rpc.rpc_sync(f"worker{(rank + 1) % world_size}", add, args=(rank, 1))
    rpc.shutdown()
    return "joined", got


class _Unpicklable(Exception):
    """An exception that cannot be pickled: it holds a lock."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = __import__("threading").Lock()


def raise_unpicklable():
    raise _Unpicklable("holding a lock")


def return_unpicklable():
    return __import__("threading").Lock()


def return_from_a_module_only_here(module_dir):
    """Return a value whose class lives in a module only this worker can import."""
    import importlib
    import sys as _sys

    _sys.path.insert(0, module_dir)
    return importlib.import_module("only_on_the_callee").Thing()


def call_errors(rank, world_size, module_dir):
    """Errors that must reach the caller while the callee keeps serving."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        import importlib
        import sys as _sys

        _sys.path.insert(0, module_dir)
        only_here = importlib.import_module("only_on_the_caller")  # the callee cannot import it
        cases = {
            "unpicklable_exception": lambda: rpc.rpc_sync("worker1", raise_unpicklable),
            "unpicklable_result": lambda: rpc.rpc_sync("worker1", return_unpicklable),
            "unknown_module": lambda: rpc.rpc_sync("worker1", only_here.double, args=(2,)),
            "result_unloadable_here": lambda: rpc.rpc_sync("worker1", return_from_a_module_only_here, args=(module_dir + "/callee",)),
            "result_unloadable_here_async": lambda: rpc.rpc_async("worker1", return_from_a_module_only_here, args=(module_dir + "/callee",)).wait(),
        }
        for name, fn in cases.items():
            try:
                fn()
                out[name] = None
            except Exception as exc:
                out[name] = (type(exc).__name__, str(exc), getattr(exc, "__notes__", []))
        out["still_serving"] = rpc.rpc_sync("worker1", add, args=(1, 2))
    rpc.shutdown()
    return out


def tls_world(rank, world_size, cert_dir, use_tls):
    """Joins under mutual TLS with the certificates in cert_dir (or without TLS)."""
    files = {}
    if use_tls == "yes":
        files = {k: os.path.join(cert_dir, f) for k, f in (("tls_cert", "cert.pem"), ("tls_key", "key.pem"), ("tls_ca", "ca.pem"))}
    try:
        init(rank, world_size, rpc_timeout=3, **files)
    except RuntimeError as exc:
        return "refused", str(exc)
    got = rpc.rpc_sync(f"worker{(rank + 1) % world_size}", add, args=(rank, 1))
    rpc.shutdown()
    return "joined", got


def unreachable_store(rank, world_size):
    """Only rank 1 runs: the store it is told of never answers."""
    return try_init(rank, world_size, rpc_timeout="2")

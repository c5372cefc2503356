"""Functions the test worlds call on each other. They live in an importable module, so they
travel by reference."""

import os
import threading
import time

import tensorplay_rpc as rpc


class CustomError(Exception):
    """An exception class of the tests' own, constructed with several arguments."""


def add(a, b):
    return a + b


def whoami():
    return rpc.get_worker_info().name


_sleeping_lock = threading.Lock()
_sleeping = 0


def _sleep_counted(seconds):
    """Sleep, counted in ``sleeping_now()`` meanwhile."""
    global _sleeping
    with _sleeping_lock:
        _sleeping += 1
    try:
        time.sleep(seconds)
    finally:
        with _sleeping_lock:
            _sleeping -= 1
    return seconds


def sleeping_now():
    """How many calls of ``slow`` and ``Sleeper.sleep`` this process is running."""
    with _sleeping_lock:
        return _sleeping


def slow(seconds):
    return _sleep_counted(seconds)


def raise_value_error(message):
    raise ValueError(message)


def raise_custom():
    raise CustomError("custom failure", 42)


class ForgedRRef:
    """Pickles as an RRef whose ids a hostile peer chose: an owner that is no worker, and ids
    out of int64's range."""

    def __init__(self, owner, rref_id=(0, 1), fork_id=(0, 2)):
        self.args = (owner, rref_id, fork_id)

    def __reduce__(self):
        from tensorplay_rpc.rref import _rebuild_rref

        return (_rebuild_rref, self.args)


def options(**kwargs):
    return rpc.TensorPipeRpcBackendOptions(**kwargs)


def init(rank, world_size, **opts):
    """Join as worker<rank> with the given backend options."""
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options(**opts))


_active = 0
_max_active = 0
_lock = threading.Lock()
_done = threading.Event()


def track_concurrency(seconds):
    """Sleep while counting how many calls run at once on this worker."""
    global _active, _max_active
    with _lock:
        _active += 1
        _max_active = max(_max_active, _active)
    time.sleep(seconds)
    with _lock:
        _active -= 1
    return threading.current_thread().name


def max_concurrency():
    return _max_active


def set_done():
    _done.set()


def shm_mappings():
    """How many shared-memory regions of the transport this process has mapped."""
    with open("/proc/self/maps") as f:
        return sum("memfd:tensorplay-rpc" in line for line in f)


def shm_resident_bytes():
    """How much of this process's mappings of the transport's regions is resident."""
    total, in_region = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0]:  # a mapping's first line: its address range
                in_region = "memfd:tensorplay-rpc" in line
            elif in_region and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def wait_done(timeout):
    """Block until another worker calls set_done (bounded)."""
    if not _done.wait(timeout):
        raise TimeoutError("nobody called set_done")


def error_of(fn):
    """Call fn; return the type and message of what it raised, or (None, None)."""
    try:
        fn()
    except BaseException as exc:  # noqa: B902 - the tests inspect whatever was raised
        return type(exc), str(exc)
    return None, None


def rss_kib():
    """This process's resident memory, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def wait_for_file(path, seconds):
    """Block until the test creates path (bounded)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def wait_until(cond, timeout=20):
    """Poll cond until it holds (True) or timeout seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Sleeper:
    """A value whose method blocks, for proxy calls left pending."""

    def sleep(self, seconds):
        return _sleep_counted(seconds)

"""Scenarios for the data plane: payloads of every kind, big calls, size limits."""

import gc
import os
import signal
import threading
import time
import warnings
import weakref

import numpy as np

import tensorplay_rpc as rpc
from tensorplay_rpc import _agent, _call_future

from .common import init, shm_mappings, shm_resident_bytes


def echo(x):
    return x


def describe(x):
    """What the callee got: type, dtype, shape, writability and a checksum."""
    if isinstance(x, np.ndarray):
        return type(x).__name__, str(x.dtype), x.shape, x.flags.writeable, None if x.dtype.hasobject else _checksum(x)
    return type(x).__name__, len(x)


def _checksum(a):
    raw = np.ascontiguousarray(a).view(np.uint8).ravel()
    step = max(1, raw.size // 4096)
    return int(raw[::step].astype(np.uint64).sum()), raw.size


def make(nbytes):
    """Runs on the callee: a result of nbytes."""
    return np.ones(nbytes, dtype=np.uint8)


def lent_count():
    """Received messages whose memory the callee's Python still uses in place."""
    gc.collect()
    return _agent.require_agent().lent_messages()


def numpy_cases():
    rng = np.random.default_rng(7)
    big = rng.standard_normal((1024, 1024))  # 8 MiB: chunked and lent
    cases = {f"dtype-{d}": (np.arange(600) % 100).astype(d) for d in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128", ">i4", "<M8[ns]", "m8[s]", "U7", "S3",
    )}
    cases.update({
        "zero-d": np.array(3.5),
        "empty": np.zeros((0,), dtype=np.float32),
        "empty-2d": np.zeros((0, 3), dtype=np.int64),
        "big": big,
        "fortran": np.asfortranarray(big[:300, :200]),
        "strided": big[::3, ::2],
        "transposed": big.T,
        "reversed": np.arange(100_000)[::-1],
        "structured": np.array([(1, 2.0), (3, 4.0)] * 300, dtype=[("a", "i4"), ("b", "f8")]),
        "object": np.array([{"x": 1}, None, "s"], dtype=object),
    })
    return cases


_lent_at_reply = []


def _record_lent_at_reply():
    """Wraps this worker's reply so it records how many received messages its Python still
    used in place as each reply left."""
    agent = _agent.require_agent()
    reply = agent._reply

    def recording(go_request, result):
        _lent_at_reply.append(agent.lent_messages())
        reply(go_request, result)

    agent._reply = recording
    _recording.set()


_recording = threading.Event()


def lent_at_reply():
    """What _record_lent_at_reply saw, reply by reply (None before it wraps the reply)."""
    return list(_lent_at_reply) if _recording.is_set() else None


def request_memory_back_before_reply(rank, world_size):
    """A big request's memory goes back to Go before its reply leaves (the callee drops the
    arguments first): a caller that sends its next big request at once finds the buffer free."""
    init(rank, world_size)
    out = {}
    if rank == 1:
        _record_lent_at_reply()
    if rank == 0:
        deadline = time.monotonic() + 20
        while rpc.rpc_sync("worker1", lent_at_reply) is None:  # until worker1 records
            assert time.monotonic() < deadline, "worker1 never wrapped its reply"
            time.sleep(0.01)
        before = len(rpc.rpc_sync("worker1", lent_at_reply))
        arr = np.ones(8 << 20, dtype=np.uint8)
        out["received"] = [rpc.rpc_sync("worker1", describe, args=(arr,))[0] for _ in range(3)]
        out["lent_at_reply"] = rpc.rpc_sync("worker1", lent_at_reply)[before:before + 3]
    rpc.shutdown()
    return out


def numpy_round_trips(rank, world_size):
    init(rank, world_size)
    out = {}
    if rank == 0:
        for name, arr in numpy_cases().items():
            back = rpc.rpc_sync("worker1", echo, args=(arr,))
            seen = rpc.rpc_sync("worker1", describe, args=(arr,))
            same = (
                type(back) is np.ndarray and back.dtype == arr.dtype and back.shape == arr.shape
                and (np.array_equal(back, arr) if arr.dtype != object else list(back) == list(arr))
            )
            out[name] = (same, back.flags.writeable, seen[3])
        del back
        # A big result arrives lent in place: counted while held, handed back once dropped.
        held = rpc.rpc_sync("worker1", make, args=(8 << 20,))
        gc.collect()
        out["lent_while_held"] = _agent.require_agent().lent_messages()
        del held
        out["lent_after"] = rpc.rpc_sync("worker1", lent_count)
        gc.collect()
        out["lent_here"] = _agent.require_agent().lent_messages()
    rpc.shutdown()
    return out


def mid_size_in_flight(rank, world_size):
    """Arrays of 64 KiB to 1 MiB, each sent in one frame (its long segments in pooled memory,
    given back once copied), echoed 32 at a time: each comes back as it was sent, though the
    pool hands the memory of one to the next."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        sizes = [64 << 10, 100 << 10, 256 << 10, (512 << 10) + 3, (1 << 20) - 1]
        calls = mismatches = 0
        for round_ in range(8):
            sent = [np.full(sizes[i % len(sizes)], (round_ * 32 + i) % 251, dtype=np.uint8) for i in range(32)]
            futures = [rpc.rpc_async("worker1", echo, args=(a,)) for a in sent]
            for a, fut in zip(sent, futures):
                calls += 1
                mismatches += not np.array_equal(fut.wait(), a)
        out = {"calls": calls, "mismatches": mismatches}
    rpc.shutdown()
    return out


_kept = []


def keep(a):
    """Runs on the callee: hold a received array (lent in place) and report how many it holds."""
    _kept.append(a)
    return len(_kept)


def check_kept():
    """Runs on the callee: are the held arrays as sent (array i all i + 1) and writable, how
    many are lent, and how much shared memory is mapped here."""
    intact = [bool((a == i + 1).all()) for i, a in enumerate(_kept)]
    writable = all(a.flags.writeable for a in _kept)
    return intact, writable, _agent.require_agent().lent_messages(), shm_resident_bytes()


def drop_kept():
    _kept.clear()
    gc.collect()
    return _agent.require_agent().lent_messages()


def landed_arrays_held(rank, world_size):
    """16 MiB arrays, which over shared memory the sender writes into the stream's 64 MiB
    landing area for the callee to use in place: the callee holds eight (more than the area
    takes, so the rest come the other way) while more traffic flows both ways; each stays as
    sent and writable, the memory goes back once dropped, and one held past shutdown stays
    readable until dropped, after which no region is mapped."""
    init(rank, world_size)
    out = {}
    n = 16 << 20
    if rank == 0:
        for i in range(8):
            rpc.rpc_sync("worker1", keep, args=(np.full(n, i + 1, dtype=np.uint8),))
        echoed = [rpc.rpc_sync("worker1", echo, args=(np.full(n, 100 + i, dtype=np.uint8),)) for i in range(4)]
        out["echoes_intact"] = all(bool((e == 100 + i).all()) for i, e in enumerate(echoed))
        del echoed
        out["intact"], out["writable"], out["lent_held"], out["shm_resident"] = rpc.rpc_sync("worker1", check_kept)
        out["lent_after_drop"] = rpc.rpc_sync("worker1", drop_kept)
        rpc.rpc_sync("worker1", keep, args=(np.full(n, 1, dtype=np.uint8),))  # held past shutdown
    rpc.shutdown()
    if rank == 1:
        out["after_shutdown_intact"] = len(_kept) == 1 and bool((_kept[0] == 1).all())
        out["mapped_while_held"] = shm_mappings()
        _kept.clear()
        gc.collect()
        out["mapped_after_drop"] = shm_mappings()
    return out


def abandoned_big_replies(rank, world_size):
    """16 MiB replies to futures dropped unread: over shared memory they land in memory the
    callee reuses only once released, so each must be given back though nobody reads it; the
    callee's later replies still arrive intact, and no region stays mapped after shutdown."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        for _ in range(6):
            rpc.rpc_async("worker1", make, args=(16 << 20,))  # dropped at once
        time.sleep(1)  # the replies come and are dropped
        got = [rpc.rpc_sync("worker1", make, args=(16 << 20,)) for _ in range(4)]
        out["later_intact"] = all(g.nbytes == 16 << 20 and bool((g == 1).all()) for g in got)
        del got
        gc.collect()
    rpc.shutdown()
    out["mapped_after_shutdown"] = shm_mappings()
    return out


def bytes_like_round_trips(rank, world_size):
    init(rank, world_size)
    out = {}
    if rank == 0:
        blob = bytes(range(256)) * 8192  # 2 MiB
        cases = {
            "bytes-empty": b"",
            "bytes-small": b"abc",
            "bytes-1k": blob[:1024],
            "bytes-big": blob,
            "bytearray-empty": bytearray(),
            "bytearray-small": bytearray(b"xyz"),
            "bytearray-big": bytearray(blob),
            "memoryview-bytes": memoryview(blob)[:5000],
            "memoryview-2d": memoryview(bytearray(blob[:4096])).cast("i", (32, 32)),
            "memoryview-strided": memoryview(blob)[::2],
            "mixed": [b"k" * 5000, bytearray(b"v" * 70000), {"n": np.arange(10_000)}, "text"],
            # Big bytes are copied out by Go into memory it readies first (huge pages,
            # populated); over shared memory the first lands, the second is over a landing.
            "bytes-huge": os.urandom(40 << 20),
            "bytes-over-a-landing": os.urandom(72 << 20),
            "mixed-huge": [os.urandom(9 << 20), np.arange(1 << 20, dtype=np.float64), os.urandom(24 << 20) + b"end"],
        }
        for name, value in cases.items():
            back = rpc.rpc_sync("worker1", echo, args=(value,))
            if isinstance(value, memoryview):
                same = type(back) is memoryview and back.tolist() == value.tolist() and back.format == value.format
            elif name == "mixed-huge":
                same = [type(b) for b in back] == [bytes, np.ndarray, bytes] and back[0] == value[0] and back[2] == value[2]
                same = same and np.array_equal(back[1], value[1])
            elif name == "mixed":
                same = back[0] == value[0] and back[1] == value[1] and np.array_equal(back[2]["n"], value[2]["n"]) and back[3] == "text"
                same = same and type(back[1]) is bytearray
            else:
                same = type(back) is type(value) and back == value
            out[name] = same
    rpc.shutdown()
    return out


_last_sum = None


def sum_then_fill(x, value):
    """Runs on the callee: record the sum of the argument it got, then overwrite it."""
    global _last_sum
    _last_sum = int(x.sum())
    x[:] = value
    return _last_sum


def make_filled(n, value):
    return np.full(n, value, dtype=np.uint8)


def last_sum():
    return _last_sum


def self_calls(rank, world_size):
    """Big arguments of calls a worker makes to itself: the callee gets its own copy (as a
    remote callee does), and a call that timed out while queued, whose handler still starts
    within the callee's grace, never reads memory the caller freed."""
    init(rank, world_size, num_worker_threads=1)
    n = 4 << 20  # 4 MiB: over the size sent from Python's memory in place
    mine = np.ones(n, dtype=np.uint8)
    out = {"sum": rpc.rpc_sync("worker0", sum_then_fill, args=(mine, 7)), "mine_after": int(mine.sum())}
    # One handler thread: the late call is queued behind a sleep that outlasts its timeout
    # but not the callee's grace, so it runs after its caller gave up.
    busy = rpc.rpc_async("worker0", time.sleep, args=(0.13,))  # the only handler thread
    late = rpc.rpc_async("worker0", sum_then_fill, args=(np.full(n, 3, dtype=np.uint8), 1), timeout=0.1)
    try:
        late.wait()
        out["late"] = "completed"
    except RuntimeError as err:
        out["late"] = str(err)
    # The timed-out call's array is garbage now; new arrays take its memory.
    scribble = [np.full(n, 9, dtype=np.uint8) for _ in range(4)]
    busy.wait()
    # The late call's handler records its sum when it runs, after the sleep's.
    deadline = time.monotonic() + 30
    while (late_sum := rpc.rpc_sync("worker0", last_sum)) == out["sum"]:
        assert time.monotonic() < deadline, "the late call's handler never ran"
        time.sleep(0.02)
    out["late_sum"] = late_sum
    del scribble
    # A big result the handler lets go of as soon as it has replied.
    out["result_sum"] = int(rpc.rpc_sync("worker0", make_filled, args=(n, 5)).sum())
    rpc.shutdown()
    return out


def torch_round_trips(rank, world_size):
    import torch

    # torch.frombuffer only warns over read-only memory and hands back a tensor that looks
    # writable: made an error here, a received tensor over read-only memory fails its call.
    warnings.filterwarnings("error", message="The given buffer is not writable")
    init(rank, world_size)
    out = {}
    if rank == 0:
        base = torch.arange(2 * 3 * 4 * 1000).reshape(2, 3, 4, 1000)
        cases = {f"dtype-{d}": (base % 7).to(getattr(torch, d)) for d in (
            "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool", "complex64",
        )}
        cases.update({
            "zero-d": torch.tensor(2.5),
            "empty": torch.zeros(0, 5),
            "transposed": base.float().transpose(0, 3),
            "sliced": base.float()[:, 1:, ::2],
            "big": torch.randn(4 * 1024 * 1024),
        })
        for name, t in cases.items():
            back = rpc.rpc_sync("worker1", echo, args=(t,))
            out[name] = type(back) is torch.Tensor and back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
        leaf = torch.ones(3, requires_grad=True)
        back = rpc.rpc_sync("worker1", echo, args=(leaf,))
        out["requires_grad"] = back.requires_grad and torch.equal(back.detach(), leaf.detach())
        big = rpc.rpc_sync("worker1", echo, args=(torch.ones(3_000_000),))
        big += 1  # a received tensor is writable
        out["writable"] = bool((big == 2).all())
    rpc.shutdown()
    return out


def arange_mismatches(x, block=64 << 20):
    """Runs on the callee: whether x is np.arange(len(x)) as uint64, checked in full, block by
    block (a chunk lost, repeated or misplaced anywhere shows): (dtype, length, writable, the
    first element index of each block that differs)."""
    bad = []
    per_block = block // 8
    for start in range(0, x.size, per_block):
        end = min(x.size, start + per_block)
        if not np.array_equal(x[start:end], np.arange(start, end, dtype=np.uint64)):
            bad.append(start)
    return str(x.dtype), x.size, x.flags.writeable, bad


def peak_rss_kib():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def nbytes(x):
    return x.nbytes


_arrived = []


def nbytes_in_turn(x):
    """nbytes, noting the order the calls came in (one serving thread: the order they were
    received in)."""
    _arrived.append(f"{x.nbytes >> 20} MiB")
    return x.nbytes


def arrived():
    return list(_arrived)


def in_place_and_turns(rank, world_size):
    """A 256 MiB argument is sent from its own memory: the caller's peak RSS does not grow by
    a copy of it. Big calls within the interleave window (64 MiB) take turns: an 8 MiB call
    made just after a 48 MiB one to the same worker is received first."""
    init(rank, world_size, num_worker_threads=1)
    out = {}
    if rank == 0:
        big = np.ones(256 << 20, dtype=np.uint8)  # written: its pages count in the RSS already
        before = peak_rss_kib()
        out["sent"] = rpc.rpc_sync("worker1", nbytes, args=(big,))
        out["peak_growth_kib"] = peak_rss_kib() - before
        # The callee is frozen while both calls are queued: 48 MiB go in about 5 ms, so
        # otherwise a slow moment in making the second call would let the first one finish.
        callee = rpc.rpc_sync("worker1", os.getpid)
        small = np.ones(8 << 20, dtype=np.uint8)
        os.kill(callee, signal.SIGSTOP)
        try:
            first = rpc.rpc_async("worker1", nbytes_in_turn, args=(big[: 48 << 20],))
            second = rpc.rpc_async("worker1", nbytes_in_turn, args=(small,))
            time.sleep(0.1)  # the writer lends what the window holds of the first one
        finally:
            os.kill(callee, signal.SIGCONT)
        out["results"] = [first.wait(), second.wait()]
        out["arrived"] = rpc.rpc_sync("worker1", arrived)
    rpc.shutdown()
    return out


def over_two_gib(rank, world_size):
    """A call of 2 GiB + 4 KiB (past the sizes a 32-bit length can hold), checked in full."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        arr = np.arange(((2 << 30) + 4096) // 8, dtype=np.uint64)
        out["seen"] = rpc.rpc_sync("worker1", arange_mismatches, args=(arr,), timeout=300)
        out["sent"] = arr.size
    rpc.shutdown()
    return out


def default_size_limit(rank, world_size):
    """With no max_message_size set, a call of 4 GiB + 1 byte is refused before it is sent (its
    array is never written, so it costs no memory)."""
    init(rank, world_size)
    out = {"default": rpc.TensorPipeRpcBackendOptions().max_message_size}
    if rank == 0:
        limit = 4 << 30
        try:
            rpc.rpc_sync("worker1", len, args=(np.zeros(limit + 1, dtype=np.uint8),))
            out["over"] = None
        except RuntimeError as exc:
            out["over"] = str(exc)
    rpc.shutdown()
    return out


def size_limits(rank, world_size):
    init(rank, world_size, max_message_size=16 << 20)
    out = {}
    if rank == 0:
        for name, fn in (
            ("too_big_arg", lambda: rpc.rpc_sync("worker1", echo, args=(np.zeros(32 << 20, dtype=np.uint8),))),
            ("too_big_result", lambda: rpc.rpc_sync("worker1", make, args=(32 << 20,))),
        ):
            try:
                fn()
                out[name] = None
            except RuntimeError as exc:
                out[name] = str(exc)
        out["still_serving"] = rpc.rpc_sync("worker1", make, args=(8 << 20,)).size
    rpc.shutdown()
    return out


_verified = {"calls": 0, "wrong": 0}


def verify_filled(tag, payload):
    """Runs on the callee: count a payload that is not ``tag`` in every byte."""
    view = np.frombuffer(payload, dtype=np.uint8)
    _verified["calls"] += 1
    if view.size != 64 << 20 or not bool((view == tag).all()):
        _verified["wrong"] += 1
    return None


def verified():
    return dict(_verified)


def dropped_big_requests(rank, world_size):
    """Futures of 64 MiB calls dropped at once, as bytes and as arrays, while other big calls
    are queued ahead of them (and RRefs dropped while their creation is in flight): the
    memory Go sends from must outlive the send, not the future. Freed early, the sending
    process dies in the frame writer's copy (or the peer reads whatever reused the memory);
    kept, every payload arrives as sent."""
    init(rank, world_size)
    out = {}
    if rank == 0:
        kept, sent, dropped_arrays = [], 0, []
        for round_ in range(8):
            tag = round_ + 1
            # Queued ahead: the dropped ones wait behind it, still unsent as they are freed.
            kept.append(rpc.rpc_async("worker1", verify_filled, args=(tag, np.full(64 << 20, tag, np.uint8))))
            rpc.rpc_async("worker1", verify_filled, args=(tag, bytes([tag]) * (64 << 20)))
            array = np.full(64 << 20, tag, np.uint8)
            dropped_arrays.append(weakref.ref(array))
            rpc.rpc_async("worker1", verify_filled, args=(tag, array))
            del array
            rref = rpc.remote("worker1", verify_filled, args=(tag, bytes([tag]) * (64 << 20)))
            del rref
            sent += 4
            gc.collect()
            # Reuse the freed pages at once, with bytes that are not the tag.
            scribble = [np.full(64 << 20, 0xEE, np.uint8) for _ in range(3)]
            del scribble
        for fut in kept:
            fut.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = rpc.rpc_sync("worker1", verified)
            if got["calls"] >= sent:
                break
            time.sleep(0.1)
        out.update(got, sent=sent)
        gc.collect()
        out["abandoned_left"] = len(_call_future._abandoned)
        out["dropped_arrays_alive"] = sum(ref() is not None for ref in dropped_arrays)
    rpc.shutdown()
    return out

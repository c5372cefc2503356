"""The API's plain objects, in one process: Future, WorkerInfo, options, backends, names."""

import pickle
import threading

import pytest

import tensorplay_rpc as rpc
from tensorplay_rpc import Future


def test_future_result_and_callbacks_in_order():
    fut = Future()
    seen = []
    assert not fut.done()
    with pytest.raises(RuntimeError):
        fut.value()
    chained = fut.then(lambda f: f.value() * 2).then(lambda f: f.value() + 1)
    fut.add_done_callback(lambda f: seen.append(("a", f.value())))
    fut.add_done_callback(lambda f: seen.append(("b", f.value())))
    fut.set_result(20)
    assert fut.done() and fut.wait() == 20 and fut.value() == 20
    assert chained.wait() == 41
    assert seen == [("a", 20), ("b", 20)]
    late = []
    fut.add_done_callback(lambda f: late.append(f.value()))
    assert late == [20]
    with pytest.raises(RuntimeError, match="can only be marked completed once"):
        fut.set_result(1)


def test_future_exceptions():
    fut = Future()
    fut.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        fut.wait()
    with pytest.raises(KeyError):
        fut.value()
    with pytest.raises(AssertionError, match="not an Exception"):  # as torch
        Future().set_exception(3)
    failing = Future()
    chained = failing.then(lambda f: 1 / 0)
    failing.set_result(1)
    with pytest.raises(RuntimeError, match="error when running the callback: ZeroDivisionError") as info:
        chained.wait()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no text")

    def raise_unprintable(_):
        raise Unprintable()

    failing = Future()
    chained = failing.then(raise_unprintable)
    failing.set_result(1)
    with pytest.raises(RuntimeError, match="Unprintable: <str"):  # completes all the same
        chained.wait()
    broken_callback = Future()
    broken_callback.add_done_callback(lambda f: 1 / 0)
    broken_callback.set_result(5)  # the callback's error is logged, not raised
    assert broken_callback.wait() == 5


def test_future_wait_across_threads():
    fut = Future()
    threading.Timer(0.2, fut.set_result, args=("late",)).start()
    assert fut.wait() == "late"


def test_a_waiting_thread_wakes_when_the_future_completes(monkeypatch):
    # A wait sleeps in slices; with hour-long ones, only completion's notify can end it soon.
    from tensorplay_rpc import futures

    monkeypatch.setattr(futures, "WAIT_SLICE_S", 3600.0)
    fut = Future()
    got = []
    waiter = threading.Thread(target=lambda: got.append(fut.wait()), daemon=True)
    waiter.start()
    threading.Timer(0.2, fut.set_result, args=("done",)).start()
    waiter.join(timeout=10)
    assert got == ["done"], "the waiting thread was not woken by the completion"


def test_collect_all_and_wait_all():
    futs = [Future() for _ in range(3)]
    combined = rpc.collect_all(futs)
    for i, f in enumerate(futs):
        assert not combined.done()
        f.set_result(i)
    assert [f.value() for f in combined.wait()] == [0, 1, 2]
    assert rpc.wait_all(futs) == [0, 1, 2]


def test_callback_threads_grow_when_busy_up_to_their_bound_and_end_when_idle():
    from tensorplay_rpc.futures import _CallbackThreads

    pool = _CallbackThreads(max_threads=2, idle_exit_s=0.3)
    release = threading.Event()
    started = []
    third_ran = threading.Event()
    pool.submit(lambda: (started.append(1), release.wait(10)))
    pool.submit(lambda: (started.append(2), release.wait(10)))
    pool.submit(third_ran.set)
    # Two blocked tasks take both threads; the third waits for one, not for a third thread.
    assert not third_ran.wait(0.5) and sorted(started) == [1, 2] and pool.busy() == 2
    release.set()
    assert third_ran.wait(10)
    for _ in range(100):  # idle threads end after idle_exit_s
        if pool._threads == 0:
            break
        threading.Event().wait(0.05)
    assert pool._threads == 0 and pool.busy() == 0


def test_a_waiting_thread_runs_only_the_librarys_callbacks_and_keeps_their_order():
    # What a thread waiting on a call's future does when it settles it (_complete(waiter=True)):
    # the library's own callbacks it may run; user callbacks, and all after the first one, run
    # on a callback thread, in the order added.
    from tensorplay_rpc.futures import library_callback

    me = threading.get_ident()
    fut = Future()
    ran = []
    all_ran = threading.Event()
    fut.add_done_callback(library_callback(lambda f: ran.append(("library", threading.get_ident() == me))))
    fut.add_done_callback(lambda f: ran.append(("user", threading.get_ident() == me)))
    fut.add_done_callback(library_callback(lambda f: (ran.append(("library", threading.get_ident() == me)), all_ran.set())))
    fut._complete(1, None, waiter=True)
    assert all_ran.wait(10)
    assert ran == [("library", True), ("user", False), ("library", False)]


def test_worker_info_value_semantics():
    a, b = rpc.WorkerInfo("w", 1), rpc.WorkerInfo("w", 1)
    assert a == b and hash(a) == hash(b) and a != rpc.WorkerInfo("w", 2)
    assert repr(a) == "WorkerInfo(id=1, name=w)"
    assert pickle.loads(pickle.dumps(a)) == a
    assert (a.name, a.id) == ("w", 1)


@pytest.mark.parametrize(
    "name, id",
    [("ok_name:1-2", 0), ("a" * 127, 3), ("bad name!", 0), ("", 0), ("a" * 128, 0), ("wörker", 0), ("x", True), ("x", 1.7), ("x", "1")],
)
def test_worker_info_validates_as_torch_does(name, id):
    """The same names and ids are refused, with the same exception type, as torch's own
    WorkerInfo (and a name's refusal in torch's words)."""
    import torch.distributed.rpc as torch_rpc

    def outcome(cls):
        try:
            info = cls(name, id)
        except Exception as exc:  # compared below, type and all
            return type(exc), str(exc)
        return None, (info.name, info.id)

    ours, theirs = outcome(rpc.WorkerInfo), outcome(torch_rpc.WorkerInfo)
    assert ours[0] is theirs[0], (ours, theirs)
    if theirs[0] is None or theirs[0] is RuntimeError:
        assert ours[1] == theirs[1], (ours, theirs)


def test_options_defaults_match_torch():
    opts = rpc.TensorPipeRpcBackendOptions()
    assert opts.num_worker_threads == 16
    assert opts.rpc_timeout == 60.0
    assert opts.init_method == "env://"
    assert opts.device_maps == {} and opts.devices == []
    with pytest.raises(TypeError):
        rpc.TensorPipeRpcBackendOptions(8)  # keyword-only, as in torch
    custom = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=2.5, init_method="tcp://h:1")
    assert (custom.num_worker_threads, custom.rpc_timeout, custom.init_method) == (4, 2.5, "tcp://h:1")


@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_worker_threads": 0}, RuntimeError, "num_worker_threads must be positive, got 0"),
    ({"num_worker_threads": "4"}, TypeError, "num_worker_threads must be an int, got str '4'"),
    ({"num_worker_threads": True}, TypeError, "num_worker_threads must be an int, got bool True"),
    ({"rpc_timeout": "5"}, TypeError, "rpc_timeout must be a number of seconds, got str '5'"),
    ({"rpc_timeout": None}, TypeError, "rpc_timeout must be a number of seconds, got NoneType None"),
    ({"rpc_timeout": -5}, RuntimeError, "RPC Timeout must be non-negative"),
    ({"rpc_timeout": float("nan")}, RuntimeError, "RPC Timeout must be non-negative"),
    ({"init_method": 5}, TypeError, "init_method must be a str, got int 5"),
    ({"max_message_size": "9"}, TypeError, "max_message_size must be an int, got str '9'"),
    ({"max_message_size": 0}, ValueError, "max_message_size must be a positive number of bytes, got 0"),
    ({"token": 123}, TypeError, "token must be a str or None, got int 123"),
    ({"tls_cert": b"x", "tls_key": "k", "tls_ca": "c"}, TypeError, "tls_cert must be a str or None, got bytes b'x'"),
])
def test_bad_options_are_refused_naming_the_option(kwargs, error, words):
    with pytest.raises(error) as raised:
        rpc.TensorPipeRpcBackendOptions(**kwargs)
    assert str(raised.value) == words


def test_backend_type():
    assert rpc.BackendType.TENSORPIPE in list(rpc.BackendType)
    assert repr(rpc.BackendType.TENSORPIPE) == "BackendType.TENSORPIPE"


SEED_NAMES = (
    "init_rpc shutdown get_worker_info get_rpc_timeout is_available rpc_sync rpc_async remote RRef Future "
    "AllGatherStates method_factory new_method BackendType BackendValue TensorPipeRpcBackendOptions "
    "register_backend backend_registered init_backend construct_rpc_backend_options"
).split()


def test_every_name_of_the_seed_page_is_exported():
    missing = [name for name in SEED_NAMES if name not in dir(rpc)]
    assert not missing
    assert callable(rpc.functions.async_execution)


def test_method_factory_forwards_and_documents():
    assert rpc.RRef.to_here.__doc__ and "owner" in rpc.RRef.to_here.__doc__
    assert callable(rpc.new_method)

    forwarded = rpc.method_factory("owner_name", "The owner's name, documented.")
    assert forwarded.__doc__ == "The owner's name, documented."
    assert forwarded.__name__ == "owner_name"

    class FakeRRef(rpc.RRef):
        """An RRef whose implementation is faked, to see what the factory's method calls."""

        def __init__(self):
            pass

    FakeRRef.name_of_owner = forwarded
    called = []
    from tensorplay_rpc.rref import PyRRef

    original = PyRRef.owner_name
    PyRRef.owner_name = lambda self: called.append(self) or "w7"
    try:
        fake = FakeRRef()
        assert fake.name_of_owner() == "w7" and called == [fake]
    finally:
        PyRRef.owner_name = original


def test_device_maps_are_validated_and_stored():
    opts = rpc.TensorPipeRpcBackendOptions(device_maps={"w1": {"cpu": "cpu"}}, devices=["cpu"])
    opts.set_device_map("w2", {0: 1, "cuda:1": "cuda:0"})
    assert opts.device_maps == {"w1": {"cpu": "cpu"}, "w2": {"cuda:0": "cuda:1", "cuda:1": "cuda:0"}}
    opts.set_device_map("w2", {0: 1})  # the same entry again is fine
    with pytest.raises(ValueError, match="only supports 1-to-1 mapping"):
        opts.set_device_map("w2", {0: 2})
    with pytest.raises(ValueError, match="one-to-one"):
        opts.set_device_map("w3", {0: 1, 2: 1})
    with pytest.raises(ValueError, match="invalid device"):
        opts.set_device_map("w3", {"not a device!": "cpu"})
    opts.set_devices(["cpu", 0])
    assert opts.devices == ["cpu", "cuda:0"]
    with pytest.raises(ValueError, match="without accelerator support.*cuda:0"):
        opts._check_devices()


def test_rref_needs_an_initialized_worker():
    with pytest.raises(RuntimeError, match="Current RPC agent is not set!"):
        rpc.RRef(1)
    with pytest.raises(RuntimeError, match="RPC has not been initialized"):
        rpc.remote("w", max, args=(1, 2))


@pytest.mark.parametrize(
    "given, env, want",
    [
        (None, None, ["shm", "tcp", "grpc"]),
        (["uv"], None, ["tcp"]),
        (["shm", "uv", "tcp", "grpc"], None, ["shm", "tcp", "grpc"]),
        (None, "grpc", ["grpc"]),
        (None, "tcp", ["tcp"]),
        (["shm"], "grpc", ["shm"]),  # the option wins over the environment
    ],
)
def test_transport_choice(monkeypatch, given, env, want):
    if env is None:
        monkeypatch.delenv("TENSORPLAY_RPC_TRANSPORTS", raising=False)
    else:
        monkeypatch.setenv("TENSORPLAY_RPC_TRANSPORTS", env)
    assert rpc.TensorPipeRpcBackendOptions(_transports=given).transport_names() == want


@pytest.mark.parametrize("given", [["ibv"], [], "shm", ["udp", "shm"]])
def test_bad_transports_are_refused(given):
    with pytest.raises((ValueError, TypeError)) as info:
        rpc.TensorPipeRpcBackendOptions(_transports=given)
    assert "_transports" in str(info.value)


def test_bad_transports_env_is_refused(monkeypatch):
    monkeypatch.setenv("TENSORPLAY_RPC_TRANSPORTS", "grpc,carrier-pigeon")
    with pytest.raises(ValueError, match="TENSORPLAY_RPC_TRANSPORTS.*carrier-pigeon"):
        rpc.TensorPipeRpcBackendOptions().transport_names()


@pytest.mark.parametrize("combine", [rpc.collect_all, rpc.wait_all])
def test_collect_all_and_wait_all_refuse_what_is_not_a_future(combine):
    done = rpc.Future()
    done.set_result(1)
    with pytest.raises(TypeError) as raised:
        combine([done, 2])
    assert str(raised.value) == f"{combine.__name__}: futures[1] is of type int, not a Future"
    assert not done._callbacks  # refused before any callback was added to the others

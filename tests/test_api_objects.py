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
    with pytest.raises(TypeError, match="not an Exception"):
        Future().set_exception(3)
    failing = Future()
    chained = failing.then(lambda f: 1 / 0)
    failing.set_result(1)
    with pytest.raises(ZeroDivisionError):
        chained.wait()
    broken_callback = Future()
    broken_callback.add_done_callback(lambda f: 1 / 0)
    broken_callback.set_result(5)  # the callback's error is logged, not raised
    assert broken_callback.wait() == 5


def test_future_wait_across_threads():
    fut = Future()
    threading.Timer(0.2, fut.set_result, args=("late",)).start()
    assert fut.wait() == "late"


def test_collect_all_and_wait_all():
    futs = [Future() for _ in range(3)]
    combined = rpc.collect_all(futs)
    for i, f in enumerate(futs):
        assert not combined.done()
        f.set_result(i)
    assert [f.value() for f in combined.wait()] == [0, 1, 2]
    assert rpc.wait_all(futs) == [0, 1, 2]


def test_worker_info_value_semantics():
    a, b = rpc.WorkerInfo("w", 1), rpc.WorkerInfo("w", 1)
    assert a == b and hash(a) == hash(b) and a != rpc.WorkerInfo("w", 2)
    assert repr(a) == "WorkerInfo(id=1, name=w)"
    assert pickle.loads(pickle.dumps(a)) == a
    assert (a.name, a.id) == ("w", 1)


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


def test_backend_type():
    assert rpc.BackendType.TENSORPIPE in list(rpc.BackendType)
    assert repr(rpc.BackendType.TENSORPIPE) == "BackendType.TENSORPIPE"

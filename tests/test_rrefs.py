"""remote(), RRefs and their reference counting, across real worker processes."""

import pytest

import tensorplay_rpc as rpc
from conftest import run_world

# Every world here runs once over shared memory and once over gRPC.
pytestmark = pytest.mark.usefixtures("each_transport")


def test_remote_and_rref_methods():
    out = run_world("rrefs:remote_basics", 2)[0].value
    assert out["to_here"] == 5
    assert out["owner"] == (rpc.WorkerInfo("worker1", 1), "worker1", False)
    assert out["confirmed"]
    exc_type, msg = out["local_value_elsewhere"]
    assert exc_type is RuntimeError and "can't call localValue() on user" in msg and "worker1" in msg
    assert out["proxy_sync"] == 15
    assert out["proxy_async"] == 16
    assert out["proxy_remote"] == 16
    assert out["proxy_async_in_callback"] == 42
    exc_type, msg = out["proxy_async_missing_cached"]
    assert exc_type is AttributeError and "missing" in msg
    assert out["proxy_async_collected"]
    assert out["proxy_async_method"] == 116
    assert out["counter_here"] == 116
    assert out["local"] == (True, "worker0", [1, 2, 3], True, True)
    assert out["to_self"] == (True, "ab", "ab")
    for key in ("creation_error_to_here", "creation_error_proxy"):
        exc_type, msg = out[key]
        assert exc_type is ValueError and "creation failed 99" in msg, key
    exc_type, msg = out["creation_error_timeout"]
    assert exc_type is RuntimeError and "RRef creation via rpc.remote() timed out" in msg
    assert out["to_here_during_creation_timeout"] == 32
    assert out["inline"] == [(1, "a", "b")] * 3
    assert out["mutable_seen_changed"] == [[1, 2, 3], [4]]
    exc_type, msg = out["to_here_timeout"]
    assert exc_type is RuntimeError and "timeout" in msg and "worker1" in msg, msg
    assert out["to_here_timeout_took"] < 2.5, "to_here waited past its own timeout"
    assert out["creation_timeout_took"] < 2.5, "to_here waited for the owner after the creation timed out"
    assert out["pickle_outside_rpc"][0] is RuntimeError
    assert out["repr"].startswith("UserRRef(RRefId = GloballyUniqueId(created_on=0")
    assert out["unknown"][0] is RuntimeError and "nobody" in out["unknown"][1]


def test_rref_forked_to_a_third_worker_and_back_to_the_owner():
    out = run_world("rrefs:forks", 3)[0].value
    assert out["returned_is_rref"]
    assert out["returned_owner"] == "worker1"
    assert out["returned_value"] == 1001
    assert out["counts_on_third"] == [1001, 1001, 1001]
    assert out["on_owner"] == (True, [True, True, True], 1001)
    assert out["owned_by_2"] == ("worker2", "kept on worker2")
    assert out["tables_1"] and out["tables_2"], "owners still keep values no one references"


@pytest.mark.timeout(360)
def test_remote_then_del_cycles_leave_the_owner_empty():
    out = run_world("rrefs:refcount_cycles", 2, args=["100000"], timeout=300)[0].value
    assert out["emptied"], out["tables"]
    assert out["tables"] == (0, 0)
    early, late = out["rss_kib"]
    assert late - early < 30 * 1024, f"owner RSS grew from {early} KiB to {late} KiB"


def test_async_execution():
    out = run_world("rrefs:async_execution", 3)[0].value
    assert out["sync"] == 3
    assert out["async"] == 7
    assert out["remote"] == 11
    assert out["chained"] == 12
    assert out["static"] == 15
    assert out["static_remote"] == 9
    assert out["class"] == ("AsyncOps", 19)
    assert out["fails"][0] is KeyError and "async failure" in out["fails"][1]
    assert out["parked"] == "unparked"


def test_futures_and_all_gather():
    results = run_world("rrefs:futures_and_gather", 3)
    for r in results:
        v = r.value
        assert v["chain"] == (r.rank + 1) * 2 + 1
        assert v["order"] == ["then1", "then2", "callback"]
        # as torch's: a callback's error reaches the chained future as a RuntimeError naming it
        assert v["then_error"][0] is RuntimeError and "ZeroDivisionError" in v["then_error"][1]
        assert v["collect_all"] == [100, 101, 102]
        assert v["wait_all"] == [1, 2, 3]
        assert v["all_gather"] == {"worker0": 0, "worker1": 10, "worker2": 20}
        assert v["all_gather_again"] == {"worker0": "r0", "worker1": "r1", "worker2": "r2"}
        if r.rank in (0, 2):
            assert v["subset"] == {"worker0": 0, "worker2": 2}
        assert v["states"] == "Event"
        if r.rank < 2:
            assert v["gather_timeout"][0] is RuntimeError and "timed out after 1.0s" in v["gather_timeout"][1], v["gather_timeout"]
            assert 0.9 < v["gather_timeout_took"] < 2.5, v["gather_timeout_took"]


def test_graceful_shutdown_with_rrefs_held():
    results = run_world("rrefs:shutdown_with_rrefs", 2, timeout=60)
    assert results[0].value[0] == 50


def test_custom_backend():
    for r in run_world("rrefs:custom_backend", 2):
        v = r.value
        assert v["member"] == ("BackendType.CUSTOM", True, True)
        assert v["duplicate"] == (RuntimeError, "RPC backend CUSTOM: already registered")
        assert v["call"] == r.rank + 1
        assert v["calls"] == ["construct", ("init", f"worker{r.rank}", r.rank, 2)]


def test_file_init_method(tmp_path):
    path = tmp_path / "rendezvous"
    results = run_world("rrefs:file_init", 3, args=[str(path)])
    assert [r.value for r in results] == [10, 11, 12]
    assert not path.exists()

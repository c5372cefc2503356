"""remote(), RRefs and their reference counting, across real worker processes."""

import pytest

import tensorplay_rpc as rpc
from conftest import expect_behaviours, raised, run_world

# Every world here runs once over shared memory and once over gRPC.
pytestmark = pytest.mark.usefixtures("each_transport")


def test_remote_and_rref_methods():
    out = run_world("rrefs:remote_basics", 2)[0].value
    expect_behaviours(out, {
        "to_here() returns the value remote() made": lambda o: o["to_here"] == 5,
        "owner(), owner_name() and is_owner() name the owner": lambda o: o["owner"] == (rpc.WorkerInfo("worker1", 1), "worker1", False),
        "confirmed_by_owner() turns true": lambda o: o["confirmed"],
        "local_value() on a user RRef is refused, naming the owner":
            lambda o: raised(RuntimeError, "can't call localValue() on user", "worker1")(o["local_value_elsewhere"]),
        "rref.rpc_sync().method() runs the method on the owner": lambda o: o["proxy_sync"] == 15,
        "rref.rpc_async().method() returns a future of the method's result": lambda o: o["proxy_async"] == 16,
        "rref.remote().method() returns an RRef of the result": lambda o: o["proxy_remote"] == 16,
        "an async proxy call made in a callback completes": lambda o: o["proxy_async_in_callback"] == 42,
        "an async proxy call of a missing method fails with AttributeError (type already known)":
            lambda o: raised(AttributeError, "missing")(o["proxy_async_missing_cached"]),
        "async proxy calls are collected by api._wait_all()": lambda o: o["proxy_async_collected"],
        "an async proxy call changes the value on the owner": lambda o: o["proxy_async_method"] == 116,
        "the owner sees the change made through the proxy": lambda o: o["counter_here"] == 116,
        "an RRef of a local value is its owner's and gives the value": lambda o: o["local"] == (True, "worker0", [1, 2, 3], True, True),
        "remote() to this worker itself makes a local RRef": lambda o: o["to_self"] == (True, "ab", "ab"),
        "a failed creation's error reaches to_here() with its type": lambda o: raised(ValueError, "creation failed 99")(o["creation_error_to_here"]),
        "a failed creation's error reaches a proxy call with its type": lambda o: raised(ValueError, "creation failed 99")(o["creation_error_proxy"]),
        "a creation that times out says so at to_here()":
            lambda o: raised(RuntimeError, "RRef creation via rpc.remote() timed out")(o["creation_error_timeout"]),
        "to_here() after the creation's own timeout fetches the value the owner still made":
            lambda o: o["to_here_during_creation_timeout"] == 32,
        "small immutable values come back with the creation (inline), thrice": lambda o: o["inline"] == [(1, "a", "b")] * 3,
        "a mutable value is fetched anew, with changes made on the owner": lambda o: o["mutable_seen_changed"] == [[1, 2, 3], [4]],
        "to_here(timeout) fails naming the owner": lambda o: raised(RuntimeError, "timeout", "worker1")(o["to_here_timeout"]),
        "to_here(timeout) gives up within its own timeout": lambda o: o["to_here_timeout_took"] < 2.5,
        "to_here(timeout) names its own timeout when the creation's ran out first":
            lambda o: raised(RuntimeError, "(310 ms)", "worker1")(o["to_here_timeout_named"]),
        "to_here() does not wait for the owner after the creation timed out": lambda o: o["creation_timeout_took"] < 2.5,
        "pickling an RRef outside an RPC is refused": lambda o: o["pickle_outside_rpc"][0] is RuntimeError,
        "repr() is torch's (UserRRef(RRefId = ...))": lambda o: o["repr"].startswith("UserRRef(RRefId = GloballyUniqueId(created_on=0"),
        "remote() to an unknown worker fails naming it": lambda o: raised(RuntimeError, "nobody")(o["unknown"]),
    })


def test_rref_forked_to_a_third_worker_and_back_to_the_owner():
    out = run_world("rrefs:forks", 3)[0].value
    expect_behaviours(out, {
        "an RRef sent back from a third worker arrives as an RRef": lambda o: o["returned_is_rref"],
        "it still names its owner": lambda o: o["returned_owner"] == "worker1",
        "its value is the owner's": lambda o: o["returned_value"] == 1001,
        "the third worker reads the value through its fork, each way": lambda o: o["counts_on_third"] == [1001, 1001, 1001],
        "on its owner the RRef is the local value": lambda o: o["on_owner"] == (True, [True, True, True], 1001),
        "an RRef the third worker owns is kept there": lambda o: o["owned_by_2"] == ("worker2", "kept on worker2"),
        "owners keep no value no one references at the end": lambda o: o["tables_1"] and o["tables_2"],
    })


@pytest.mark.timeout(360)
def test_remote_then_del_cycles_leave_the_owner_empty():
    out = run_world("rrefs:refcount_cycles", 2, args=["100000"], timeout=300)[0].value
    assert out["emptied"], f"the owner's tables never emptied: {out['tables']}"
    assert out["tables"] == (0, 0), f"the owner's tables after 100,000 cycles: {out['tables']}"
    early, late = out["rss_kib"]
    assert late - early < 30 * 1024, f"owner RSS grew from {early} KiB to {late} KiB"


def test_async_execution():
    out = run_world("rrefs:async_execution", 3)[0].value
    expect_behaviours(out, {
        "rpc_sync of an async_execution function returns its future's value": lambda o: o["sync"] == 3,
        "rpc_async of it too": lambda o: o["async"] == 7,
        "remote() of it keeps the future's value": lambda o: o["remote"] == 11,
        "a future chained with then() is awaited": lambda o: o["chained"] == 12,
        "a static method can be async_execution": lambda o: o["static"] == 15,
        "and called through remote()": lambda o: o["static_remote"] == 9,
        "a class method can be async_execution": lambda o: o["class"] == ("AsyncOps", 19),
        "a future that fails raises its error on the caller, with its type":
            lambda o: o["fails"][0] is KeyError and "async failure" in o["fails"][1],
        "a reply waits for a future parked by another call, without holding a thread": lambda o: o["parked"] == "unparked",
    })


def test_futures_and_all_gather():
    results = run_world("rrefs:futures_and_gather", 3)
    for r in results:
        behaviours = {
            f"rank {r.rank}: then() chains run in order on the value": lambda v: v["chain"] == (r.rank + 1) * 2 + 1,
            f"rank {r.rank}: callbacks run in the order they were added": lambda v: v["order"] == ["then1", "then2", "callback"],
            # as torch's: a callback's error reaches the chained future as a RuntimeError naming it
            f"rank {r.rank}: a then() callback's error fails the chained future as a RuntimeError naming it":
                lambda v: v["then_error"][0] is RuntimeError and "ZeroDivisionError" in v["then_error"][1],
            f"rank {r.rank}: collect_all gives every future": lambda v: v["collect_all"] == [100, 101, 102],
            f"rank {r.rank}: wait_all gives every value": lambda v: v["wait_all"] == [1, 2, 3],
            f"rank {r.rank}: _all_gather gathers every worker's object": lambda v: v["all_gather"] == {"worker0": 0, "worker1": 10, "worker2": 20},
            f"rank {r.rank}: _all_gather works again": lambda v: v["all_gather_again"] == {"worker0": "r0", "worker1": "r1", "worker2": "r2"},
            f"rank {r.rank}: the future's state machinery is an Event": lambda v: v["states"] == "Event",
        }
        if r.rank in (0, 2):
            behaviours[f"rank {r.rank}: _all_gather over a subset of workers"] = lambda v: v["subset"] == {"worker0": 0, "worker2": 2}
        if r.rank < 2:
            behaviours[f"rank {r.rank}: _all_gather with a missing worker times out after its timeout"] = (
                lambda v: v["gather_timeout"][0] is RuntimeError and "timed out after 1.0s" in v["gather_timeout"][1] and 0.9 < v["gather_timeout_took"] < 2.5)
        expect_behaviours(r.value, behaviours)


def test_graceful_shutdown_with_rrefs_held():
    caller, owner = run_world("rrefs:shutdown_with_rrefs", 2, timeout=60)
    expect_behaviours(owner.value, {
        "the owner dropped the values user RRefs still held at shutdown, as torch's": lambda o: o["owned_after"] == 0,
    })
    assert "dropped RRefs held only by a worker that is gone" not in owner.output, owner.output
    caller = caller.value
    expect_behaviours(caller, {
        "a bad timeout is refused before anything changes":
            lambda o: raised(TypeError, "timeout must be a number of seconds, got str")(o["bad_timeout"]),
        "and the worker is still up": lambda o: o["still_up"] == 3 and o["small_before"] == 41,
        "every held RRef survived until shutdown": lambda o: o["held"] == 50 and o["tracked_held"] == 20,
        "a user RRef used after shutdown raises, even with its value cached":
            lambda o: o["small_after"][0] is RuntimeError and "has been deleted. Cannot call to_here() on it after deletion." in o["small_after"][1],
    })


def test_a_refused_send_leaves_no_fork_behind():
    out = run_world("rrefs:refused_send_with_an_rref", 3, timeout=60)[0].value
    expect_behaviours(out, {
        "the call is refused for its size": lambda o: raised(RuntimeError, "message too large")(o["refused"]),
        "the owner holds the value while the caller does": lambda o: o["owned_while_held"] == (1, 1),
        "and drops it once the caller drops its RRef": lambda o: o["emptied"],
    })


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

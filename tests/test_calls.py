"""Calls between real worker processes: results, names, errors, timeouts, threads."""

import pytest

from conftest import expect_behaviours, raised, run_world

# Every world here runs once over shared memory and once over gRPC.
pytestmark = pytest.mark.usefixtures("each_transport")


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_worker_calls_every_worker(world_size):
    results = run_world("basic:all_to_all", world_size)
    for r in results:
        for peer in range(world_size):
            got = r.value[f"worker{peer}"]
            assert got == (r.rank + peer, r.rank + 10, r.rank + 100, f"worker{peer}", "xy")


def test_worker_info():
    results = run_world("basic:worker_infos", 3)
    for r in results:
        v = r.value
        assert v["me"] == (f"worker{r.rank}", r.rank, f"WorkerInfo(id={r.rank}, name=worker{r.rank})", f"WorkerInfo(id={r.rank}, name=worker{r.rank})")
        assert v["all"] == [("worker0", 0), ("worker1", 1), ("worker2", 2)]
        assert v["equal"] and v["hash"] and v["distinct"]
        assert v["timeout"] == 60.0


def test_errors_reach_the_caller():
    out = run_world("basic:errors", 2)[0].value
    expect_behaviours(out, {
        "a remote ValueError arrives as ValueError, naming the worker, with the remote traceback":
            lambda o: raised(ValueError, "bad value 17", "On WorkerInfo(id=1, name=worker1)", "Traceback (most recent call last)", "raise_value_error")(o["value_error"]),
        "a remote error reaches rpc_async's future too": lambda o: raised(ValueError, "async 18")(o["value_error_async"]),
        "a user's exception class arrives as itself, with its arguments":
            lambda o: o["custom"][0].__name__ == "CustomError" and o["custom"][0].__module__ == "worlds.common" and raised(o["custom"][0], "custom failure", "42")(o["custom"]),
        "wrong arguments give the callee's TypeError": lambda o: raised(TypeError, "missing 1 required positional argument")(o["bad_args"]),
        "an unknown worker name is refused as torch words it":
            lambda o: o["unknown_name"] == (RuntimeError, "name:worker0,rank:0 could not find destination name nobody"),
        "an unknown worker id is refused as torch words it":
            lambda o: o["unknown_id"] == (RuntimeError, "name:worker0,rank:0 could not find destination id 7"),
        "a WorkerInfo of no worker is refused, naming it": lambda o: raised(RuntimeError, "ghost")(o["unknown_info"]),
        "get_worker_info() of an unknown name is refused, naming it": lambda o: raised(RuntimeError, "nobody")(o["unknown_info_lookup"]),
        "past the API, Go refuses an unknown destination the same way":
            lambda o: raised(RuntimeError, "could not find destination worker ghost", "not a worker")(o["unknown_in_go"]),
        "a callable is required, as torch words it": lambda o: o["not_callable"] == (TypeError, "function should be callable."),
        "a destination of a wrong type is refused as torch words it": lambda o: o["bad_to"] == (ValueError, "Cannot get WorkerInfo from name 3.5"),
        "an argument that cannot be pickled fails on the caller": lambda o: raised(TypeError, "lock")(o["unpicklable_arg"]),
        # RRef ids come from peers: bad ones are refused when the RRef is unpickled, before the
        # Go side or the owner table sees them.
        "an RRef naming an owner that is no worker is refused on unpickling":
            lambda o: raised(ValueError, "owner 99, which is not a worker")(o["forged_rref_owner"]),
        "a malformed RRef id is refused on unpickling": lambda o: raised(ValueError, "malformed RRef id")(o["forged_rref_id"]),
        "a second init_rpc is refused": lambda o: o["second_init"] == (RuntimeError, "RPC is already initialized"),
        "the callee keeps serving after all of these": lambda o: o["still_serving"] == 3,
    })


def test_timeouts():
    out = run_world("basic:timeouts", 2)[0].value
    for key, limit in (("explicit", 300), ("explicit_async", 300), ("default", 1000)):
        (exc_type, msg), took = out[key]
        assert exc_type is RuntimeError, key
        assert "timed out" in msg and "worker1" in msg and f"({limit} ms)" in msg, msg
        assert limit / 1000 * 0.9 <= took < limit / 1000 + 4, (key, took)
    assert out["none"] == 1.5
    assert out["still_serving"] == 5
    assert out["timeout"] == 1.0


def test_worker_thread_pool_and_free_gil():
    out = run_world("basic:thread_pool", 2)[0].value
    assert out["max_concurrency"] == 3
    assert len(out["threads"]) == 3
    assert out["spinner_ran_during_the_call"], "a thread could not run while rpc_sync waited: the caller kept the GIL"


def test_callbacks_run_without_a_waiter():
    out = run_world("basic:callbacks", 2)[0].value
    assert out["callback_alone"] == (True, [5])
    assert out["then_alone"] == (True, "chained")
    assert out["error_alone"] == (True, ["ValueError"])
    assert out["waited"] == (0.2, [0.2])
    assert out["nested"] == (True, [26]), "a callback waiting on a nested call hung"
    assert out["after_exit"] == (True, [2])
    assert out["pending_after"] == 0


def test_rank_and_world_size_from_environment():
    results = run_world("basic:env_only", 3)
    for r in results:
        assert r.value == (f"env{r.rank}", r.rank, f"env{(r.rank + 1) % 3}")


def test_seed_example_runs_as_main(tmp_path):
    results = run_world("scripts", 2, script="scripts/seed_example.py")
    assert results[0].output.split() == ["7", "42", "15", "abcd"]


def test_exception_classes_defined_in_main_reach_the_caller_as_themselves():
    results = run_world("scripts", 2, script="scripts/main_exception.py")
    assert results[0].output.split("\n")[:2] == ["MainError True True True", "CodedError True True True"], results[0].output


def test_errors_that_cannot_travel_as_themselves(tmp_path):
    (tmp_path / "only_on_the_caller.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "callee").mkdir()
    (tmp_path / "callee" / "only_on_the_callee.py").write_text("class Thing:\n    pass\n")
    out = run_world("faults:call_errors", 2, args=[str(tmp_path)])[0].value
    kind, msg, _ = out["unpicklable_exception"]
    assert "_Unpicklable" in kind + msg and "holding a lock" in msg and "Traceback" in msg
    kind, msg, _ = out["unpicklable_result"]
    assert kind == "RuntimeError" and "TypeError: cannot pickle" in msg and "lock" in msg
    kind, msg, _ = out["unknown_module"]
    assert kind == "ModuleNotFoundError" and "only_on_the_caller" in msg
    # A result that pickles on the callee but cannot be unpickled here fails the call here.
    for case in ("result_unloadable_here", "result_unloadable_here_async"):
        kind, msg, notes = out[case]
        assert kind == "ModuleNotFoundError" and "only_on_the_callee" in msg, out[case]
        assert notes == ["(raised here unpickling the result sent by worker worker1)"], out[case]
    assert out["still_serving"] == 3

"""Calls between real worker processes: results, names, errors, timeouts, threads."""

import json

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
        me = f"WorkerInfo(id={r.rank}, name=worker{r.rank})"
        expect_behaviours(r.value, {
            f"worker{r.rank}'s own WorkerInfo has its name and id, and prints as torch's": lambda v: v["me"] == (f"worker{r.rank}", r.rank, me, me),
            "get_worker_infos lists every worker in rank order": lambda v: v["all"] == [("worker0", 0), ("worker1", 1), ("worker2", 2)],
            "WorkerInfos compare equal by value": lambda v: v["equal"],
            "equal WorkerInfos hash alike": lambda v: v["hash"],
            "different workers' WorkerInfos differ": lambda v: v["distinct"],
            "get_rpc_timeout gives the default 60 s": lambda v: v["timeout"] == 60.0,
        })


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


def _timed_out_within(limit_ms: int):
    """A check that a (error, seconds taken) outcome is a timeout naming worker1 and its limit,
    which fired no earlier than the limit and not long after it."""
    def check(outcome):
        (exc_type, msg), took = outcome
        return (exc_type is RuntimeError and "timed out" in msg and "worker1" in msg and f"({limit_ms} ms)" in msg
                and limit_ms / 1000 * 0.9 <= took < limit_ms / 1000 + 4)
    return check


def test_timeouts():
    out = run_world("basic:timeouts", 2)[0].value
    expect_behaviours(out, {
        "rpc_sync's timeout= fails a slow call in time, naming the worker and the limit": lambda o: _timed_out_within(300)(o["explicit"]),
        "rpc_async's timeout= fails its future in time": lambda o: _timed_out_within(300)(o["explicit_async"]),
        "the options' rpc_timeout applies when a call gives none": lambda o: _timed_out_within(1000)(o["default"]),
        "timeout=0 waits as long as the call takes": lambda o: o["none"] == 1.5,
        "the callee keeps serving after the timeouts": lambda o: o["still_serving"] == 5,
        "get_rpc_timeout gives the options' value": lambda o: o["timeout"] == 1.0,
    })


def test_worker_thread_pool_and_free_gil():
    out = run_world("basic:thread_pool", 2)[0].value
    expect_behaviours(out, {
        "num_worker_threads=3 runs three calls at once, no more": lambda o: o["max_concurrency"] == 3,
        "the calls ran on three distinct threads": lambda o: len(o["threads"]) == 3,
        "a Python thread runs while rpc_sync waits (the caller let go of the GIL)": lambda o: o["spinner_ran_during_the_call"],
    })


def test_callbacks_run_without_a_waiter():
    out = run_world("basic:callbacks", 2)[0].value
    expect_behaviours(out, {
        "add_done_callback runs with no thread waiting": lambda o: o["callback_alone"] == (True, [5]),
        "then() chains with no thread waiting": lambda o: o["then_alone"] == (True, "chained"),
        "a callback sees a remote error with no thread waiting": lambda o: o["error_alone"] == (True, ["ValueError"]),
        "a thread waiting on a future still has its callbacks run": lambda o: o["waited"] == (0.2, True, [0.2]),
        "a callback may wait on a nested call without hanging": lambda o: o["nested"] == (True, [26]),
        "a callback raising SystemExit does not stop the next callbacks or later futures'": lambda o: o["after_exit"] == (True, [2]),
        "no call is left pending afterwards": lambda o: o["pending_after"] == 0,
    })


@pytest.mark.timeout(150)
def test_callbacks_run_off_the_waiting_thread_and_apart():
    out = run_world("basic:callbacks_off_the_waiter", 2, timeout=120)[0].value
    took_on_another_thread = [(True, True)]
    expect_behaviours(out, {
        **{f"a callback takes a lock the thread in {how}() holds, once released (no deadlock)":
           (lambda how: lambda o: o[f"lock_held_in_{how}"] == took_on_another_thread)(how)
           for how in ("wait", "done", "wait_all", "then")},
        "a blocked callback holds up no other future's callbacks (no thread waiting)":
            lambda o: o["blocked_callback_blocks_no_other_alone"] == (True, True, True),
        "a blocked callback holds up no other future's callbacks (a thread waiting)":
            lambda o: o["blocked_callback_blocks_no_other_waited"] == (True, True, True),
        "20 callbacks that block until all run, run at once": lambda o: o["twenty_blocked_callbacks_run_at_once"] == (20, False),
        "a callback added while earlier ones run goes after them": lambda o: o["order"] == [1, 2],
        "then() on a complete future runs at once on the caller's thread, as torch's":
            lambda o: o["then_on_complete_future"] == ([True], 4),
        "shutdown returns once the callbacks of completed calls have run": lambda o: o["callback_ran_before_shutdown_returned"] == [0.2],
    })


def test_rank_and_world_size_from_environment():
    results = run_world("basic:env_only", 3)
    for r in results:
        assert r.value == (f"env{r.rank}", r.rank, f"env{(r.rank + 1) % 3}")


def test_seed_example_runs_as_main(tmp_path):
    results = run_world("scripts", 2, script="scripts/seed_example.py")
    assert results[0].output.split() == ["7", "42", "15", "abcd"]


def test_main_functions_and_classes_go_by_reference():
    """torch's parameter-server tutorial's pattern: a __main__ function reading a global behind
    a lock (by value, the lock could not be pickled)."""
    output = run_world("scripts", 2, script="scripts/main_by_reference.py", timeout=60)[0].output
    out = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    expect_behaviours(out, {
        "a __main__ function uses the callee's global, made once under its lock":
            lambda o: o["server"] == [["worker1", 1], ["worker1", 2], ["worker1", 3]] and o["server_async"] == ["worker1", 4],
        "module state changed by __main__ functions persists across calls": lambda o: o["bumps"] == [1, 2, 3] and o["bumps_here"] == [],
        "instances of __main__ classes and Enum members are the callee's own": lambda o: o["inspect"] == [True, True, True, 5],
        "and come back as the caller's own": lambda o: o["returned_enum_is_ours"] and o["returned_instance_is_ours"],
        "a big __main__ global stays where it is": lambda o: o["big_marked"] == 7 and o["big_read"] == 7 and o["big_here"] == 0,
        "and is not sent with the function": lambda o: o["bytes_for_two_calls"] < 64 << 10,
        "lambdas and closures still go by value": lambda o: o["lambda"] == 42 and o["closure"] == 15,
        "the RRef proxies resolve __main__ names too": lambda o: o["rref_proxy"] == 5,
        "a name only the caller's __main__ has fails naming it and the callee":
            lambda o: o["missing"][0] == "MissingMainNameError" and "only_on_the_caller" in o["missing"][1] and "worker1" in o["missing"][1],
    })


def test_exception_classes_defined_in_main_reach_the_caller_as_themselves():
    results = run_world("scripts", 2, script="scripts/main_exception.py")
    assert results[0].output.split("\n")[:2] == ["MainError True True True", "CodedError True True True"], results[0].output


def test_errors_that_cannot_travel_as_themselves(tmp_path):
    (tmp_path / "only_on_the_caller.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "callee").mkdir()
    (tmp_path / "callee" / "only_on_the_callee.py").write_text("class Thing:\n    pass\n")
    out = run_world("faults:call_errors", 2, args=[str(tmp_path)])[0].value
    expect_behaviours(out, {
        "an exception that cannot be pickled arrives as an error naming it, with the remote traceback":
            lambda o: "_Unpicklable" in o["unpicklable_exception"][0] + o["unpicklable_exception"][1]
            and "holding a lock" in o["unpicklable_exception"][1] and "Traceback" in o["unpicklable_exception"][1],
        "a result that cannot be pickled fails the call with the pickling error":
            lambda o: o["unpicklable_result"][0] == "RuntimeError" and "TypeError: cannot pickle" in o["unpicklable_result"][1] and "lock" in o["unpicklable_result"][1],
        "a function from a module only the caller has fails with ModuleNotFoundError":
            lambda o: o["unknown_module"][0] == "ModuleNotFoundError" and "only_on_the_caller" in o["unknown_module"][1],
        # A result that pickles on the callee but cannot be unpickled here fails the call here.
        **{f"a result only the callee can unpickle fails {how} here, with a note naming the sender":
           (lambda case: lambda o: o[case][0] == "ModuleNotFoundError" and "only_on_the_callee" in o[case][1]
            and o[case][2] == ["(raised here unpickling the result sent by worker worker1)"])(case)
           for how, case in (("rpc_sync", "result_unloadable_here"), ("rpc_async", "result_unloadable_here_async"))},
        "the callee keeps serving after all of these": lambda o: o["still_serving"] == 3,
    })


def test_torch_waits_on_call_futures_that_no_thread_of_ours_settles():
    out = run_world("basic:torch_waits", 2)[0].value
    expect_behaviours(out, {
        "torch.futures.wait_all of calls under way": lambda o: o["wait_all"] == [i + 100 for i in range(64)],
        "torch.futures.collect_all": lambda o: o["collect_all"] == [i + 200 for i in range(8)],
        "torch.jit.wait": lambda o: o["jit_wait"] == 3,
        "the futures are torch futures": lambda o: o["is_torch_future"],
        # Filled only when torch looks: copying every outcome into it cost a call a fifth of
        # its time with torch imported.
        "torch's state of calls complete long ago is still empty": lambda o: o["torch_state_before_looking"] == 0,
        "and torch.futures.wait_all of them gets their values": lambda o: o["wait_all_late"] == [i + 300 for i in range(8)],
    })


def test_an_idle_worker_after_a_burst_costs_no_cpu():
    used = [r.value for r in run_world("basic:idle_after_burst", 2)]
    # A reader left polling takes a core-second a second; the idle threads' timers take ~1 ms.
    assert max(used) < 0.3, f"CPU seconds each worker used in 2 idle seconds after a burst: {used}"

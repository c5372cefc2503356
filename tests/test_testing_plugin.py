"""The pytest plugin (tensorplay_rpc.testing, issue 14): a world per module, functions run on
chosen workers, exceptions kept, a killed worker, and a hung or dead world killed by PID with
each worker's log tail. The failing cases run in a pytest of their own."""

import operator
import os
import subprocess
import sys
import textwrap
import time

import pytest

import tensorplay_rpc as rpc

pytestmark = pytest.mark.rpc_world(workers=3, timeout=30)


class Refused(Exception):
    """An exception class of this module: it must reach the test as itself."""


def refuse(why: str) -> None:
    raise Refused(why)


def whoami_and_pid() -> tuple:
    return rpc.get_worker_info().name, os.getpid()


def ask(peer: str) -> str:
    """A worker calling another worker."""
    return rpc.rpc_sync(peer, whoami_and_pid)[0]


def test_functions_run_on_the_chosen_worker(rpc_world):
    assert rpc_world.names == ["w1", "w2", "w3"]
    for name in rpc_world.names:
        assert rpc_world.run(name, whoami_and_pid) == (name, rpc_world.pids[name])
    assert rpc_world.run("w2", operator.add, 1, 2) == 3
    assert rpc_world.run_all(operator.mul, 2, 3) == {"w1": 6, "w2": 6, "w3": 6}
    assert rpc_world.run("w1", ask, "w3") == "w3"
    assert rpc_world.run("w1", ask, "w0") == "w0"  # this process is a member


def test_a_functions_exception_reaches_the_test_as_itself(rpc_world):
    with pytest.raises(Refused, match="no thanks"):
        rpc_world.run("w2", refuse, "no thanks")
    assert rpc_world.killed is None
    assert rpc_world.run("w2", operator.add, 2, 2) == 4


def test_a_killed_worker_leaves_the_others_working(rpc_world):
    # Last in this module: w3 stays dead.
    rpc_world.kill("w3")
    with pytest.raises(RuntimeError, match="w3"):
        rpc.rpc_sync("w3", operator.add, args=(1, 1), timeout=10)
    assert rpc_world.run("w1", operator.add, 1, 1) == 2
    assert rpc_world.killed is None


FAILING = textwrap.dedent(
    """
    import os
    import time

    import pytest

    pytestmark = pytest.mark.rpc_world(workers=2, timeout={timeout})

    def hang():
        print("about to hang", flush=True)
        time.sleep(600)

    def die():
        print("about to die", flush=True)
        os._exit(3)

    def test_{case}(rpc_world):
        rpc_world.run("w2", {case})
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case, timeout, says", [
    ("hang", 5, "RPC ran for more than set timeout"),
    ("die", 30, "w2"),
])
def test_a_hung_or_dead_world_is_killed_with_each_workers_log_tail(tmp_path, case, timeout, says):
    (tmp_path / f"test_{case}.py").write_text(FAILING.format(case=case, timeout=timeout))
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=100,
    )
    took = time.monotonic() - started
    report = out.stdout + out.stderr
    assert out.returncode == 1, report
    assert "WorldHung" in report and "rpc_world killed" in report and says in report, report
    assert f"about to {case}" in report, report  # w2's log tail
    assert "--- w1 (pid" in report and "--- w2 (pid" in report, report
    if case == "die":
        assert "--- w2 (pid" in report and "exit 3)" in report, report
    # Killed at its deadline, not left to pytest's timeout.
    assert took < timeout + 40, took

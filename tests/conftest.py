"""Runs worlds of real worker processes on loopback for the tests.

A test names a scenario, ``module:function`` under ``tests/worlds``; every rank runs it in its
own process (tests/_runner.py) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, and the
test gets back what each rank returned. Every process is ended by its PID when the world is
over or its time is up.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import pytest

from ports import free_port  # noqa: F401 - tests import it from here

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(TESTS_DIR, "_runner.py")


@dataclass
class RankResult:
    """What one rank's process did."""

    rank: int
    returncode: Optional[int]
    value: Any
    error: Optional[str]
    output: str


class WorldFailed(AssertionError):
    """A rank failed or the world ran out of time."""


@dataclass
class World:
    """A world started by :func:`start_world`."""

    procs: List[subprocess.Popen]
    outs: List[str]
    logs: List[str]
    port: int

    def kill(self, rank: int) -> None:
        """SIGKILL one rank by its PID."""
        self.procs[rank].send_signal(signal.SIGKILL)

    def finish(self, timeout: float) -> List[RankResult]:
        """Wait for every rank, killing all by PID once ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        timed_out = False
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            end_processes(self.procs)
        results = []
        for rank, p in enumerate(self.procs):
            value, error = None, None
            if os.path.exists(self.outs[rank]):
                with open(self.outs[rank], "rb") as f:
                    outcome = pickle.load(f)
                value, error = outcome.get("value"), outcome.get("error")
            with open(self.logs[rank], errors="replace") as f:
                output = f.read()
            results.append(RankResult(rank, p.returncode, value, error, output))
        if timed_out:
            raise WorldFailed(f"world timed out after {timeout}s\n" + _describe(results))
        return results


def end_processes(procs: List[subprocess.Popen], grace: float = 2.0) -> None:
    """End every process still running, by PID: SIGTERM first (the runner then dumps every
    thread's stack to its log), SIGKILL for those still there after ``grace`` seconds. Every
    process gets its signals before any is waited for long: on a loaded host a wait can run
    out, and it must not leave the rest running."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in running:
        try:
            p.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    stragglers = [p for p in running if p.poll() is None]
    for p in stragglers:
        p.kill()
    deadline = time.monotonic() + 30
    for p in stragglers:
        try:
            p.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass  # SIGKILL was sent; the kernel reaps it


def _describe(results: List[RankResult]) -> str:
    parts = []
    for r in results:
        parts.append(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.error or ''}\n{r.output[-4000:]}")
    return "\n".join(parts)


def start_world(
    scenario: str,
    world_size: int,
    *,
    ranks: Optional[List[int]] = None,
    env: Optional[Dict[str, str]] = None,
    args: Optional[List[str]] = None,
    script: Optional[str] = None,
    launch_prefix: Optional[Dict[int, List[str]]] = None,
) -> World:
    """Start one process per rank running ``scenario`` (``module:function`` in tests/worlds),
    or, if ``script`` is given, running that script as ``__main__``. ``launch_prefix`` gives
    ranks a command that runs theirs (``ip netns exec NS``, which execs it: the PID is still
    the rank's own)."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tensorplay-world-")
    procs, outs, logs = [], [], []
    for rank in ranks if ranks is not None else range(world_size):
        out = os.path.join(tmp, f"rank{rank}-{len(procs)}.pkl")
        log = os.path.join(tmp, f"rank{rank}-{len(procs)}.log")
        proc_env = dict(os.environ)
        proc_env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            PYTHONUNBUFFERED="1",
        )
        proc_env.update(env or {})
        with open(log, "wb") as logf:
            procs.append(
                subprocess.Popen(
                    (launch_prefix or {}).get(rank, [])
                    + ([sys.executable, script] if script else [sys.executable, RUNNER, scenario, out] + list(args or [])),
                    cwd=TESTS_DIR,
                    env=proc_env,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
        outs.append(out)
        logs.append(log)
    return World(procs, outs, logs, port)


def raised(kind: type, *parts: str) -> Callable[[Any], bool]:
    """A check that a world's (exception type, message) outcome is of ``kind`` and its message
    says each of ``parts``."""
    return lambda outcome: outcome[0] is kind and all(p in outcome[1] for p in parts)


def expect_behaviours(out: Dict[str, Any], behaviours: Dict[str, Callable[[Dict[str, Any]], Any]]) -> None:
    """Check each behaviour a world reported (``out``, its rank's value), by name: every check
    runs, and the failure lists each behaviour that did not hold, with what the world saw.
    A check passes when it returns a true value and raises nothing."""
    failed = []
    for behaviour, check in behaviours.items():
        try:
            held = check(out)
        except Exception as exc:  # a missing key or a malformed value: the behaviour failed
            held, detail = False, f"{type(exc).__name__}: {exc}"
        else:
            detail = ""
        if not held:
            failed.append(f"- {behaviour}{' (' + detail + ')' if detail else ''}")
    assert not failed, "these behaviours did not hold:\n" + "\n".join(failed) + f"\nthe world reported: {out!r}"[:6000]


def run_world(scenario: str, world_size: int, *, timeout: float = 60, expect_ok: bool = True, **kwargs) -> List[RankResult]:
    """Run a world to the end and return each rank's result; by default every rank must
    succeed."""
    world = start_world(scenario, world_size, **kwargs)
    try:
        results = world.finish(timeout)
    finally:
        # Also reached when pytest's own timeout interrupts the wait.
        end_processes(world.procs)
    if expect_ok and any(r.returncode != 0 or r.error for r in results):
        raise WorldFailed(_describe(results))
    return results


@pytest.fixture(params=["shm", "tcp", "grpc"])
def each_transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once per transport: the worlds it starts are pinned to it (through
    TENSORPLAY_RPC_TRANSPORTS), so the same-host path and the path between hosts are both
    tested."""
    monkeypatch.setenv("TENSORPLAY_RPC_TRANSPORTS", request.param)
    return request.param


@pytest.fixture
def world():
    """Start worlds whose processes are killed by PID when the test ends."""
    started: List[World] = []

    def start(*args, **kwargs) -> World:
        w = start_world(*args, **kwargs)
        started.append(w)
        return w

    yield start
    for w in started:
        end_processes(w.procs)

"""Dynamic membership (issue 12): init_rpc(world_size=None) worlds that workers join and
leave one at a time, checked against torch where torch supports it, and under churn: many
joins and leaves in random order, and a worker killed, while two workers keep calling
everyone present."""

import json
import os
import subprocess
import sys
import time
from typing import Dict, List

import pytest

from conftest import end_processes, expect_behaviours, free_port

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SEQUENCE = os.path.join(TESTS_DIR, "differential", "dynamic_world.py")
CHURN = os.path.join(TESTS_DIR, "dynamic_churn.py")
TORCH_PYTHON = "/usr/bin/python3"  # Debian's interpreter, which has python3-torch
WORLD_TIMEOUT_S = 120


def run_sequence(python: str, backend: str, tmp: str) -> Dict[int, List[str]]:
    """Run dynamic_world.py's three workers on one backend; each one's printed lines."""
    sync = os.path.join(tmp, backend)
    os.makedirs(sync)
    port = free_port()
    procs = [
        subprocess.Popen([python, SEQUENCE, backend, str(rank), str(port), sync],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(3)
    ]
    try:
        outs = {}
        deadline = time.monotonic() + WORLD_TIMEOUT_S
        for rank, p in enumerate(procs):
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            assert p.returncode == 0, f"{backend} w{rank} ended with {p.returncode}:\n{out}\n{err[-3000:]}"
            outs[rank] = out.splitlines()
        return outs
    except subprocess.TimeoutExpired:
        pytest.fail(f"{backend}: the dynamic world did not end in {WORLD_TIMEOUT_S} s")
    finally:
        end_processes(procs)


@pytest.mark.timeout(2 * WORLD_TIMEOUT_S + 30)
def test_joins_and_leaves_as_torch(tmp_path):
    theirs = run_sequence(TORCH_PYTHON, "torch.distributed.rpc", str(tmp_path))
    ours = run_sequence(sys.executable, "tensorplay_rpc", str(tmp_path))
    assert ours == theirs
    # What the comparison covers, so it cannot pass on two empty runs.
    assert "sees after w1 left: [('w0', 0), ('w2', 2)]" in ours[0]
    assert "calls 1: RuntimeError: name:w0,rank:0 could not find destination id 1" in ours[0]


def start_churn(python: str, role: str, *args: str) -> subprocess.Popen:
    log = open(os.path.join(args[2], f"{role}-{args[0]}-{time.monotonic_ns()}.log"), "w")
    return subprocess.Popen([python, CHURN, role, *args], stdout=log, stderr=subprocess.STDOUT)


def wait_file(path: str, timeout: float, ok=lambda value: True) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                value = json.load(f)
            if ok(value):
                return value
        time.sleep(0.05)
    pytest.fail(f"{os.path.basename(path)}: not there (or not as expected) after {timeout} s")


def logs(sync: str) -> str:
    text = []
    for name in sorted(os.listdir(sync)):
        if name.endswith(".log"):
            with open(os.path.join(sync, name)) as f:
                text.append(f"--- {name}\n{f.read()[-2000:]}")
    return "\n".join(text)


CHURNERS = 4
CYCLES = 12  # each: 4 × 12, plus the killed worker's join and its successor's 2: 51 in all


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
def test_churn_while_two_workers_keep_calling(tmp_path):
    sync, port = str(tmp_path), str(free_port())
    procs = []
    try:
        procs += [start_churn(sys.executable, "anchor", str(rank), port, sync) for rank in (0, 1)]
        for rank in (0, 1):
            wait_file(os.path.join(sync, f"joined{rank}"), 60)
        churners = [start_churn(sys.executable, "churner", str(i), port, sync, str(100 + i), str(CYCLES)) for i in range(CHURNERS)]
        doomed = start_churn(sys.executable, "churner", "9", port, sync, "900", "1", "stay")
        procs += churners + [doomed]

        # Killed while in the world, c9 must be dropped from it (nobody told of its death).
        wait_file(os.path.join(sync, "c9_staying"), 60)
        wait_file(os.path.join(sync, "view0"), 10, lambda view: "c9" in view)
        doomed.kill()
        for rank in (0, 1):
            wait_file(os.path.join(sync, f"view{rank}"), 15, lambda view: "c9" not in view)
        successor = start_churn(sys.executable, "churner", "9", port, sync, "901", "2")
        procs.append(successor)

        for p in churners + [successor]:
            assert p.wait(timeout=WORLD_TIMEOUT_S) == 0, logs(sync)
        open(os.path.join(sync, "churn_over"), "w").close()
        anchors = [wait_file(os.path.join(sync, f"anchor{rank}"), 30) for rank in (0, 1)]
        for p in procs[:2]:
            assert p.wait(timeout=30) == 0, logs(sync)
    finally:
        end_processes(procs)

    for rank, report in enumerate(anchors):
        other = f"anchor{1 - rank}"
        expect_behaviours(report, {
            f"anchor{rank} ends seeing only the anchors": lambda r: r["final"] == ["anchor0", "anchor1"],
            f"anchor{rank}'s calls to {other} never failed": lambda r: not [f for f in r["failures"] if f[0] == other],
            # A churner's failures all name it (it was leaving).
            f"every failed call of anchor{rank} names the worker it was to": lambda r: not [f for f in r["failures"] if f[0] not in f[1]],
            f"anchor{rank} saw every churner join": lambda r: {f"c{i}" for i in range(CHURNERS)} <= set(r["seen"]),
            f"anchor{rank} kept calling throughout": lambda r: r["calls"] > 100,
        })
    joins = 0
    for i in range(CHURNERS):
        with open(os.path.join(sync, f"c{i}.{100 + i}")) as f:
            cycles = json.load(f)
        assert len(cycles) == CYCLES, f"c{i} joined {len(cycles)} times, not {CYCLES}"
        joins += len(cycles)
        for cycle in cycles:
            # A joiner sees both anchors at once, and reaches them.
            assert {"anchor0", "anchor1", f"c{i}"} <= set(cycle["sees"]), f"a joining c{i} did not see both anchors at once: {cycle}"
            anchor_calls = [c for c in cycle["calls"] if c[0].startswith("anchor")]
            assert anchor_calls == [["anchor0", "ok"], ["anchor1", "ok"]], f"a joining c{i} could not call both anchors: {cycle}"
    with open(os.path.join(sync, "c9.901")) as f:
        joins += len(json.load(f)) + 1
    assert joins >= 50, f"only {joins} joins happened"


@pytest.mark.timeout(WORLD_TIMEOUT_S + 30)
def test_rrefs_of_an_owner_that_left_fail_naming_it(tmp_path):
    sync, port = str(tmp_path), str(free_port())
    script = os.path.join(TESTS_DIR, "dynamic_rrefs.py")
    procs = [subprocess.Popen([sys.executable, script, str(rank), port, sync], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        for p in procs:
            out, _ = p.communicate(timeout=WORLD_TIMEOUT_S)
            assert p.returncode == 0, out
    finally:
        end_processes(procs)
    with open(os.path.join(sync, "report")) as f:
        report = json.load(f)
    gone = "RuntimeError: the owner of this RRef, worker w1 (id 1), left the world"
    # At once, not after a timeout; and still so once another w1 joined under its id.
    fails_at_once = lambda outcome: outcome.startswith(gone) and outcome.endswith("[0.0 s]")  # noqa: E731
    expect_behaviours(report, {
        "an RRef owned by w1 resolves while w1 is in the world": lambda r: r["before"] == 1000 and r["owner"] == "w1",
        "to_here() fails at once, naming the owner that left": lambda r: fails_at_once(r["to_here"]),
        "a proxy call fails at once, naming it": lambda r: fails_at_once(r["proxy"]),
        "passing the RRef on fails at once, naming it": lambda r: fails_at_once(r["pass_on"]),
        "to_here() still fails so once another w1 joined under its id": lambda r: fails_at_once(r["to_here_again"]),
        "calls to the new w1 succeed": lambda r: r["call_again"].startswith("2 "),
        # Dropping the RRef sent the new w1 nothing to keep.
        "the new w1 owns nothing of the old one's": lambda r: r["owned_on_new_w1"] == "0",
    })

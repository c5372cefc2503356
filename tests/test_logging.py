"""The Go core's log records reach Python's logging (issue 14), at the level
TENSORPLAY_RPC_LOG_LEVEL asks for, and nothing of it goes to stderr by itself."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import end_processes, free_port

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
WORLD = os.path.join(TESTS_DIR, "logging_world.py")


def run_world(tmp, level=None):
    env = dict(os.environ)
    env.pop("TENSORPLAY_RPC_LOG_LEVEL", None)
    if level:
        env["TENSORPLAY_RPC_LOG_LEVEL"] = level
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, WORLD, str(r), port, tmp], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(3)]
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(tmp, "joined1")):
            assert time.monotonic() < deadline and procs[1].poll() is None, "w1 never joined"
            time.sleep(0.05)
        procs[1].kill()
        out0, err0 = procs[0].communicate(timeout=60)
        assert procs[0].returncode == 0, err0
        assert procs[2].wait(timeout=30) == 0
    finally:
        end_processes(procs)
    records = {}
    for rank in (0, 2):
        with open(os.path.join(tmp, f"records{rank}.json")) as f:
            records[rank] = [tuple(r) for r in json.load(f)]
    return records, err0


@pytest.mark.timeout(150)
def test_core_records_reach_python_logging(tmp_path):
    by_rank, stderr = run_world(str(tmp_path))
    records = by_rank[0] + by_rank[2]
    # Whichever of w0 and w2 found w1 gone first says so.
    gone = [r for r in records if 'worker "w1" is gone (its process ended without leaving)' in r[1]]
    assert gone and gone[0][0] == "WARNING", by_rank
    assert not [r for r in records if r[0] == "DEBUG"], by_rank  # warning and up by default
    assert "is gone (its process ended" not in stderr, stderr  # through logging only


@pytest.mark.timeout(150)
def test_debug_records_when_asked(tmp_path):
    by_rank, _ = run_world(str(tmp_path), level="debug")
    assert ("DEBUG", 'worker "w2" left the world worker=w0') in by_rank[0], by_rank

"""The profile the README quotes (bench/phases.py) still runs: a short run of it, each
transport, prints every phase of small calls and of calls carrying a 16 MiB tensor, the counts
per call, and the machine's copy rates."""

import os
import subprocess
import sys

import pytest

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.mark.timeout(300)
def test_phases_profile_runs():
    env = dict(os.environ, PHASES_CALLS="100")
    done = subprocess.run([sys.executable, "phases.py"], cwd=BENCH_DIR, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    for transport in ("shm", "grpc"):
        assert f"transport: {transport}" in done.stdout, done.stdout
    assert done.stdout.count("boundary calls") == 4 and done.stdout.count("total") == 4, done.stdout
    assert done.stdout.count("GB/s") >= 2 + 1 and "process_vm_readv" in done.stdout, done.stdout

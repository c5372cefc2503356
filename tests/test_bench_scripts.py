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
    for transport in ("shm", "tcp", "grpc"):
        assert f"transport: {transport}" in done.stdout, done.stdout
    assert done.stdout.count("boundary calls") == 6 and done.stdout.count("total") == 6, done.stdout
    lines = done.stdout.splitlines()
    rates = [line for line in lines if line.startswith("rate ") and line.endswith(" GB/s")]
    assert len(rates) == 3, done.stdout  # the 16 MiB tensor calls, per transport
    assert any(line.startswith("copying 16 MiB here: memcpy ") and "process_vm_readv" in line for line in lines), done.stdout

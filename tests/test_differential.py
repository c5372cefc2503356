"""The same scenario on torch.distributed.rpc and on tensorplay_rpc gives the same outcomes
(issue 12's harness starts here: each scenario in tests/differential prints its outcomes,
one per line, and both backends must print the same)."""

import os
import subprocess
import sys

import pytest

from conftest import free_port

DIFFERENTIAL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "differential")
BACKENDS = {"torch": "torch.distributed.rpc", "tensorplay": "tensorplay_rpc"}


def outcomes(scenario: str, backend: str) -> list:
    done = subprocess.run(
        [sys.executable, os.path.join(DIFFERENTIAL_DIR, scenario + ".py"), BACKENDS[backend], str(free_port())],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, f"{backend}: {done.stdout}{done.stderr}"
    return done.stdout.splitlines()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", ["destinations", "futures"])
def test_same_outcomes_as_torch(scenario):
    theirs, ours = outcomes(scenario, "torch"), outcomes(scenario, "tensorplay")
    assert theirs, "torch printed nothing"
    assert ours == theirs

"""The same scenarios on torch.distributed.rpc and on tensorplay_rpc give the same outcomes
(issue 12). Each module of tests/differential runs in a world of real processes once per
backend (tests/differential/harness.py); every scenario's outcome line must agree, except
where a scenario says we differ on purpose, and why: then ours must be the one it names."""

import importlib
import os
import signal
import subprocess
import sys
from typing import Dict, List

import pytest

from conftest import free_port

DIFFERENTIAL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "differential")
HARNESS = os.path.join(DIFFERENTIAL_DIR, "harness.py")
MODULES = ["destinations", "calls", "errors", "callbacks", "rrefs", "private_names", "lifecycle", "torch_objects", "torch_futures", "dist_autograd"]
TORCH_PYTHON = "/usr/bin/python3"  # Debian's interpreter, which has python3-torch

sys.path.insert(0, DIFFERENTIAL_DIR)


# One module's run on one backend takes 5 to 70 s here.
RUN_TIMEOUT_S = 300


def outcomes(module: str, python: str, backend: str) -> Dict[str, str]:
    # A session of its own: a run that overstays is ended with every process it started.
    harness = subprocess.Popen(
        [python, HARNESS, backend, module, str(free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = harness.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(harness.pid, signal.SIGKILL)
        out, err = harness.communicate()
        pytest.fail(f"{backend} on {module}: no end in {RUN_TIMEOUT_S} s\n{out}{err[-3000:]}")
    assert harness.returncode == 0, f"{backend} on {module}: {out}{err[-3000:]}"
    return dict(line.split("\t", 1) for line in out.splitlines())


def scenarios(module: str) -> List:
    return importlib.import_module(module).SCENARIOS


def test_enough_scenarios():
    """The issue asks for at least 80, over every area it names."""
    assert sum(len(scenarios(m)) for m in MODULES) >= 80


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("module", MODULES)
def test_same_outcomes_as_torch(module):
    theirs = outcomes(module, TORCH_PYTHON, "torch.distributed.rpc")
    ours = outcomes(module, sys.executable, "tensorplay_rpc")
    wrong = []
    for s in scenarios(module):
        mine, torch_s = ours.get(s.name, "<missing>"), theirs.get(s.name, "<missing>")
        if s.differs is not None:
            ok = mine.startswith(s.ours)
        elif s.type_only is not None:
            ok = mine.split(":", 1)[0] == torch_s.split(":", 1)[0]
        else:
            ok = mine == torch_s
        if not ok:
            wrong.append(f"{s.name}\n  torch: {torch_s}\n  ours:  {mine}" + (f"\n  (differs on purpose, ours must start with: {s.ours})" if s.differs else ""))
    assert not wrong, "\n".join(wrong)

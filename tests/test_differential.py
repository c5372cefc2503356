"""The same scenarios on torch.distributed.rpc and on tensorplay_rpc give the same outcomes
(issue 12). Each module of tests/differential runs in a world of real processes once per
backend (tests/differential/harness.py); every scenario's outcome line must agree, except
where a scenario says we differ on purpose, and why: then ours must be the one it names. Both
backends must give a line for every scenario, and a hang or a crash is never agreement."""

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
        mine, torch_s = ours.get(s.name), theirs.get(s.name)
        why = agreement_failure(s, mine, torch_s)
        if why:
            wrong.append(f"{s.name}: {why}\n  torch: {torch_s}\n  ours:  {mine}" + (f"\n  (differs on purpose, ours must start with: {s.ours})" if s.differs else ""))
    assert not wrong, "\n".join(wrong)


def failed_to_run(line: str) -> bool:
    """Whether an outcome line says the scenario gave no outcome: it hung, or its process died."""
    return line.startswith("hangs:") or line.startswith("died with exit code")


def agreement_failure(s, mine, torch_s) -> str:
    """Why a scenario's outcomes do not count as agreeing, or "". Both backends must report
    it (a line missing from both is no agreement), and a hang or a crash is a failure on either
    side, unless the scenario declares torch's (and ours then differs, as it says)."""
    if mine is None or torch_s is None:
        return "no outcome line from " + " and ".join(n for n, line in (("torch", torch_s), ("ours", mine)) if line is None)
    if failed_to_run(mine):
        return "ours gave no outcome"
    if failed_to_run(torch_s) and not s.torch_hangs:
        return "torch gave no outcome, and the scenario does not say that is torch's"
    if s.torch_hangs and torch_s != "not run: torch hangs":
        return "declared to hang on torch, but torch ran it"
    if s.differs is not None:
        return "" if mine.startswith(s.ours) else "ours is not what the scenario says we give"
    if s.type_only is not None:
        return "" if mine.split(":", 1)[0] == torch_s.split(":", 1)[0] else "the exception types differ"
    return "" if mine == torch_s else "the outcomes differ"


def test_agreement_needs_two_outcomes_and_no_hang():
    from harness import Scenario

    plain = Scenario("s", lambda: None)
    hangs_on_torch = Scenario("h", lambda: None, "torch hangs", "ok 1", torch_hangs=True)
    cases = [
        (plain, "ok 1", "ok 1", False),
        (plain, None, None, True),  # missing from both is no agreement
        (plain, "ok 1", None, True),
        (plain, "hangs: no outcome in 20 s", "hangs: no outcome in 20 s", True),  # a shared hang
        (plain, "died with exit code 1", "died with exit code 1", True),  # a shared crash
        (plain, "ok 1", "died with exit code -9", True),
        (hangs_on_torch, "ok 1", "not run: torch hangs", False),
        (hangs_on_torch, "hangs: no outcome in 20 s", "not run: torch hangs", True),
    ]
    for s, mine, theirs, fails in cases:
        assert bool(agreement_failure(s, mine, theirs)) == fails, (s.name, mine, theirs)

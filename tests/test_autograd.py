"""Distributed autograd under faults (what it computes is compared with torch's in
tests/differential/dist_autograd.py, and the tutorials that use it in tests/test_examples.py)."""

import pytest

from conftest import expect_behaviours, run_world

pytestmark = pytest.mark.usefixtures("each_transport")


def test_a_worker_killed_mid_backward_fails_the_backward_naming_it():
    results = run_world("autograd:peer_dies_mid_backward", 3, timeout=90, expect_ok=False)
    assert results[1].returncode == -9, results[1].output[-2000:]
    assert results[0].returncode == 0 and results[2].returncode == 0, (results[0].output[-3000:], results[2].output[-3000:])
    expect_behaviours(results[0].value, {
        "the backward fails naming the dead worker": lambda o: o["killed"] is not None and "worker1" in o["killed"],
        "promptly": lambda o: o["killed_took"] < 20,
        "the others still train": lambda o: o["after_kill"] == [2.0, 2.0, 2.0],
    })


def test_a_worker_frozen_mid_backward_fails_the_backward_at_the_timeout_naming_it():
    out = run_world("autograd:peer_freezes_mid_backward", 3, timeout=90)[0].value
    expect_behaviours(out, {
        "the backward fails naming the frozen worker": lambda o: o["frozen"] is not None and "worker1" in o["frozen"],
        "at the RPC timeout (3 s), not never": lambda o: 2.5 < o["frozen_took"] < 30,
        "the others still train": lambda o: o["after_freeze"] == [2.0, 2.0, 2.0],
    })

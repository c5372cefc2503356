"""Ctrl-C reaches a worker blocked anywhere in the API within half a second."""

import signal
import time

import pytest


@pytest.mark.parametrize("what", ["rpc_sync", "wait", "to_here", "init", "shutdown"])
def test_sigint_interrupts_a_blocked_call(world, tmp_path, what):
    ready, report = tmp_path / "ready", tmp_path / "report"
    w = world("interrupts:blocked", 2, ranks=[0] if what == "init" else [0, 1], args=[what, str(ready), str(report)])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), "worker0 never got to the blocking call"
    time.sleep(0.5)  # let it block in Go
    sent_at = time.monotonic()
    w.procs[0].send_signal(signal.SIGINT)
    result = w.finish(timeout=20) if what == "init" else None
    if result is None:
        w.procs[0].wait(timeout=20)
    assert w.procs[0].returncode == 0, open(w.logs[0]).read()
    waited = float(report.read_text()) - sent_at
    assert waited < 0.5, f"KeyboardInterrupt came {waited:.2f}s after SIGINT"

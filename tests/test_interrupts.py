"""Ctrl-C reaches a worker blocked anywhere in the API within about 0.1 s."""

import platform
import signal
import time

import pytest

# futex(2)'s number: a thread blocked in it is asleep in a wait (Go's, for a blocked call).
FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]

# The README promises about 0.1 s; the rest is this loaded 2-core machine's scheduling. A
# wait in slices of 0.5 s would mostly miss it.
INTERRUPT_BOUND_S = 0.3
# A main thread's first wait slice is 0.1 s; the later ones (2 s) end only by the signal
# itself: the SIGINT is sent once the call has blocked for longer than the first.
PAST_THE_FIRST_SLICE_S = 0.4


def main_thread_waits_in_futex(pid: int) -> bool:
    """Whether the process's main thread is asleep in futex(2) right now."""
    with open(f"/proc/{pid}/task/{pid}/syscall") as f:
        return f.read().split()[0] == str(FUTEX)


def main_thread_switches(pid: int) -> int:
    """How many times the process's main thread has been switched out so far."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)


def block_worker0(world, tmp_path, what):
    """Start the interrupts world with worker0 blocking in ``what``; return it once worker0's
    main thread has waited past its first wait slice."""
    ready, report = tmp_path / "ready", tmp_path / "report"
    w = world("interrupts:blocked", 2, ranks=[0] if what == "init" else [0, 1], args=[what, str(ready), str(report)])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), "worker0 never got to the blocking call"
    # Blocked means asleep in a wait, seen on consecutive looks (a wait for the GIL on the
    # way in is brief): a SIGINT before the call blocks would not test the wait.
    pid, seen, blocked_since = w.procs[0].pid, 0, time.monotonic()
    while (seen < 3 or time.monotonic() - blocked_since < PAST_THE_FIRST_SLICE_S) and time.monotonic() < deadline:
        if main_thread_waits_in_futex(pid):
            seen += 1
        else:
            seen, blocked_since = 0, time.monotonic()
        time.sleep(0.02)
    assert seen >= 3, f"worker0's main thread never settled in a wait during {what}"
    return w, report


def interrupt_worker0(w, report, what) -> float:
    """SIGINT worker0 and return how long its KeyboardInterrupt took to come."""
    sent_at = time.monotonic()
    w.procs[0].send_signal(signal.SIGINT)
    result = w.finish(timeout=20) if what == "init" else None
    if result is None:
        w.procs[0].wait(timeout=20)
    assert w.procs[0].returncode == 0, open(w.logs[0]).read()
    return float(report.read_text()) - sent_at


@pytest.mark.parametrize("what", ["rpc_sync", "wait", "wait_torch_future", "to_here", "init", "shutdown", "rpc_sync_with_a_wakeup_fd_of_its_own"])
def test_sigint_interrupts_a_blocked_call(world, tmp_path, what):
    w, report = block_worker0(world, tmp_path, what)
    waited = interrupt_worker0(w, report, what)
    assert waited < INTERRUPT_BOUND_S, f"KeyboardInterrupt came {waited:.2f}s after SIGINT"


@pytest.mark.parametrize("what", ["rpc_sync", "shutdown"])
def test_a_main_thread_blocked_in_go_is_not_woken_ten_times_a_second(world, tmp_path, what):
    # Returning to Python every 100 ms would switch it out 30 times or more in 3 s; in 2 s
    # slices, a few times.
    w, report = block_worker0(world, tmp_path, what)
    pid = w.procs[0].pid
    before = main_thread_switches(pid)
    time.sleep(3)  # the behaviour is about time: what a blocked main thread does in 3 s
    switches = main_thread_switches(pid) - before
    assert switches < 10, f"worker0's main thread was switched out {switches} times in 3 s while blocked in {what}"
    assert interrupt_worker0(w, report, what) < INTERRUPT_BOUND_S

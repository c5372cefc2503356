"""Ctrl-C for a main thread that waits in Go, without waking it ten times a second.

Python runs signal handlers on its main thread, and only between calls into Go. A main thread
that waits in Go therefore waits in slices: the first of ``WAIT_SLICE_S``, the later ones long,
once this module has pointed Python's signal wakeup fd (``signal.set_wakeup_fd``) at a pipe
that Go reads; Python's C-level handler writes a byte there as a signal arrives, which ends the
main thread's wait at once. If another wakeup fd is set (an asyncio loop with signal handlers),
it is left alone and the main thread keeps to short slices. Other threads see no signals and
wait in long slices.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

from ._native import pybind as _go
from .constants import WAIT_SLICE_S

# A wait slice that Ctrl-C does not have to end (other threads, or a main thread whose signals
# end its wait through the pipe).
LONG_SLICE_MS = 2000
SHORT_SLICE_MS = max(1, round(WAIT_SLICE_S * 1000))

_main_ident = threading.main_thread().ident
# The pipe's write end, once made; Go owns (and reads) the read end.
_write_end: Optional[int] = None
# In a forked child the pipe is the parent's and Go does not run: short slices only.
_forked = False


def on_main_thread() -> bool:
    """Whether this is the thread Python runs signal handlers on."""
    return threading.get_ident() == _main_ident


def _armed() -> bool:
    """Make the pipe Python's signal wakeup fd, unless another fd is; report whether it is.
    Main thread only (a signal handler may call it again from within: nothing here waits)."""
    global _write_end
    if _forked:
        return False
    try:
        if _write_end is None or not _go.WatchingInterrupts():
            read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            if not _go.WatchInterrupts(read_end):  # a nested call got there first
                os.close(read_end)
                os.close(write_end)
                return False
            _write_end = write_end
        previous = -1
        try:
            previous = signal.set_wakeup_fd(_write_end, warn_on_full_buffer=False)
        finally:
            if previous not in (-1, _write_end):
                signal.set_wakeup_fd(previous)  # someone else's: theirs it stays
    except (OSError, ValueError):  # out of descriptors, or not the main interpreter
        return False
    return previous in (-1, _write_end)


class WaitSlices:
    """The slices of one wait in Go, and whether the wait is ``interruptible`` (a signal ends
    it: it is the main thread's). Whether the pipe is armed is settled once per wait, on its
    second slice: most waits end within the first, and arming costs system calls."""

    __slots__ = ("interruptible", "_later_ms", "_slices")

    def __init__(self) -> None:
        self.interruptible = on_main_thread()
        self._later_ms = LONG_SLICE_MS
        self._slices = 0

    def next_ms(self) -> int:
        """How long the next slice may last before the wait comes back to Python."""
        self._slices += 1
        if not self.interruptible:
            return LONG_SLICE_MS
        if self._slices == 1:
            return SHORT_SLICE_MS
        if self._slices == 2 and not _armed():
            self._later_ms = SHORT_SLICE_MS
        return self._later_ms


def disarm() -> None:
    """Give back Python's signal wakeup fd, if it is the pipe (at shutdown, on the main
    thread)."""
    if _write_end is None or _forked or not on_main_thread():
        return
    _give_back()


def _give_back() -> None:
    """Unset the pipe as Python's signal wakeup fd; another program's stays."""
    try:
        previous = signal.set_wakeup_fd(-1)
        if previous not in (-1, _write_end):
            signal.set_wakeup_fd(previous)
    except (OSError, ValueError):
        pass


def _after_fork_in_child() -> None:
    global _forked, _main_ident
    _main_ident = threading.get_ident()  # the thread that forked is the child's only one
    if _write_end is not None:
        _forked = True
        _give_back()


os.register_at_fork(after_in_child=_after_fork_in_child)

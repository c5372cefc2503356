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

_MAIN_IDENT = threading.main_thread().ident
# The pipe's write end, once made: it lives as long as the process, read by Go.
_write_end: Optional[int] = None
_lock = threading.Lock()


def on_main_thread() -> bool:
    """Whether this is the thread Python runs signal handlers on."""
    return threading.get_ident() == _MAIN_IDENT


def _armed() -> bool:
    """Make the pipe Python's signal wakeup fd, unless another fd is; report whether it is.
    Main thread only."""
    global _write_end
    with _lock:
        if _write_end is None:
            read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            if not _go.WatchInterrupts(read_end):
                os.close(read_end)
                os.close(write_end)
                return False
            _write_end = write_end
    previous = signal.set_wakeup_fd(_write_end, warn_on_full_buffer=False)
    if previous in (-1, _write_end):
        return True
    signal.set_wakeup_fd(previous)  # someone else's: theirs it stays
    return False


def slice_ms(first: bool) -> int:
    """How long this thread's next wait in Go may last before coming back to Python: a
    main thread's first slice is short (most waits end within it, and arming costs two system
    calls), its later ones long if a signal ends them."""
    if not on_main_thread():
        return LONG_SLICE_MS
    if first:
        return SHORT_SLICE_MS
    return LONG_SLICE_MS if _armed() else SHORT_SLICE_MS


def disarm() -> None:
    """Give back Python's signal wakeup fd, if it is the pipe (at shutdown, on the main
    thread)."""
    if _write_end is None or not on_main_thread():
        return
    previous = signal.set_wakeup_fd(-1)
    if previous not in (-1, _write_end):
        signal.set_wakeup_fd(previous)

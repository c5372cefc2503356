"""The future of a call this worker made: the Go call it waits on (in slices, so Ctrl-C gets
through; on a thread that serves requests, letting Go serve meanwhile), its settling into a
value or a remote error, and the buffers of a big request kept until Go no longer reads them."""

from __future__ import annotations

import itertools
import math
import numbers
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from . import _interrupts, crosslang
from ._buffers import SegmentTable, scratch
from ._native import pybind as _go
from .futures import Future
from .internal import RemoteException, deserialize

if TYPE_CHECKING:
    from ._agent import TensorPipeAgent

def call_timeout(timeout: Any, default: float) -> float:
    """A call's timeout in seconds, checked before anything is sent: ``default`` (the agent's
    rpc_timeout) for a negative one, as torch's UNSET_RPC_TIMEOUT; 0 or infinity for none. A
    value that is no number of seconds (text, None, NaN, which torch takes for a negative
    deadline and fails, or hangs on) is refused, naming it."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    seconds = float(timeout)
    if math.isnan(seconds):
        raise ValueError("timeout must be a number of seconds, got nan")
    if seconds < 0:
        return default
    return 0.0 if math.isinf(seconds) else seconds


def _to_ms(seconds: float) -> int:
    """A duration for Go, in whole milliseconds; 0 (no limit) for ``seconds <= 0``.

    Rounded to the nearest millisecond, not truncated: truncation turns 1.001 s into 1000 ms
    through float error, shortening the timeout asked for. At least 1, so a tiny positive
    timeout never becomes 0, which Go reads as no limit."""
    if seconds <= 0:
        return 0
    return max(1, round(seconds * 1000))


def _wait_on_go(wait: Callable[[int, bool], bool]) -> None:
    """Block until ``wait(timeout_ms, interruptible)`` (a Go wait) reports done, in slices: a
    signal such as Ctrl-C reaches Python only when the Go call returns (see _interrupts)."""
    slices = _interrupts.WaitSlices()
    while not wait(slices.next_ms(), slices.interruptible):
        pass


# Set on the threads that serve requests (their agent): see _CallFuture.wait_for.
_serving_thread = threading.local()

# Requests sent from Python's memory in place whose futures were dropped before they were sent
# (see _abandon), by the id of the event that says Go no longer reads them. Kept by the module,
# not the agent: a table an agent never heard back about is then never freed, rather than freed
# while a writer may still read it.
_abandoned: Dict[int, SegmentTable] = {}
# Their ids start far above any notify id (a count per agent from 1), so one event id space
# serves both.
_FIRST_ABANDONED_ID = 1 << 62
_abandoned_ids = itertools.count(_FIRST_ABANDONED_ID)


def release_abandoned(event: int) -> bool:
    """If ``event`` (NextEvent's) says Go no longer reads an abandoned request, let its buffers
    go; report whether it was such an event."""
    if event < _FIRST_ABANDONED_ID:
        return False
    table = _abandoned.pop(event, None)
    if table is not None:
        table.release()
    return True


def _abandon(go_call: Any, table: SegmentTable) -> None:
    """Keep the buffers of a call whose future was dropped until Go no longer reads them.

    Runs in ``__del__``, on whatever thread the collector runs: no lock is taken (a dict's
    item assignment and ``next`` on a count are atomic under the GIL).
    """
    abandoned_id = next(_abandoned_ids)
    _abandoned[abandoned_id] = table
    go_call.Abandon(abandoned_id)


class _CallFuture(Future[Any]):
    """The future of an outgoing call. It holds the Go call until the reply is turned into its
    result. A thread that waits collects the reply from Go itself, and hands the callbacks to a
    callback thread (it must not run them inside its wait). A call that has callbacks and no
    waiting thread is settled, callbacks and all, on a callback thread the event thread gives
    it (Go's Call.Notify), so a call that is waited for never wakes the event thread."""

    def __init__(self, agent: "TensorPipeAgent", dest: str, timeout_s: float, prefixed: bool, function: Optional[str] = None) -> None:
        super().__init__()
        self._agent = agent
        self._dest = dest
        self._function = function  # the name called, for a call of a remote function (msgpack)
        self._timeout_ms = _to_ms(timeout_s)
        # The timeout a timeout error names: the caller's whole one where this call has only
        # what was left of it (a fetch after to_here() waited for the creation).
        self.named_timeout_ms = self._timeout_ms
        self._prefixed = prefixed  # a remote error's message starts with its type (to_exception)
        self.timed_out = False  # set once the call failed for want of an answer in time
        self._go_call: Any = None
        self._notify_id = 0  # set once a callback or a torch wait asks for the completion event
        # A big request is sent from its buffers in place: they live until the call is done.
        self._table: Optional[SegmentTable] = None
        self._settle_lock = threading.Lock()

    def _attach(self, go_call: Any, table: Optional[SegmentTable]) -> None:
        """Hold the Go call (and the buffers it borrows) until the reply is settled."""
        self._go_call, self._table = go_call, table
        # A torch-flavoured future's torch state is filled when the call is settled: by the
        # thread that waits, or, for torch's own waits (collect_all, wait_all, jit.wait),
        # which tell it first (futures._hook_torch_waits), by the event thread. Nothing is
        # asked of the event thread for a call nobody waits on that way.

    def add_done_callback(self, callback: Callable[[Future[Any]], None]) -> None:
        """Run ``callback(self)`` once this future completes; errors it raises are logged."""
        super().add_done_callback(callback)
        self._notify_when_done()

    def __del__(self) -> None:
        # Dropped unsettled: nobody will read the reply, whose memory (for a big one, shared
        # memory its sender reuses only once it is released) goes back when it comes.
        go_call = getattr(self, "_go_call", None)
        if go_call is None:
            return
        table = self._table
        try:
            if table is None:
                go_call.Discard()
            else:
                _abandon(go_call, table)
        except Exception:  # interpreter shutdown may have torn the extension down
            pass

    def _before_torch_wait(self, blocking: bool) -> None:
        """A torch function is about to wait on this future's torch state (see Future): one
        that does not block has the event thread settle the call once it completes."""
        super()._before_torch_wait(blocking)
        if not blocking:
            self._notify_when_done()

    def _notify_when_done(self) -> None:
        """Have the event thread settle the call once it completes."""
        with self._settle_lock:
            go_call = self._go_call
            if go_call is None or self._notify_id:
                return
            self._notify_id = next(self._agent._notify_ids)
        with self._agent._pending_lock:
            self._agent._pending[self._notify_id] = self
        go_call.Notify(self._notify_id)

    def done(self) -> bool:
        """Whether the future has a result or an exception."""
        go_call = self._go_call  # read once: another thread may settle the call meanwhile
        if go_call is not None and not self._done and go_call.Wait(0, False):
            self._settle(waiter=True)
        return self._done

    def wait(self) -> Any:
        """Block until the call completes; return its result or raise its error."""
        self.wait_for(None)
        return super().wait()

    def wait_for(self, seconds: Optional[float]) -> bool:
        """Wait up to ``seconds`` (None: as long as it takes) for the call to complete;
        report whether it has."""
        go_call = self._go_call
        if go_call is None or self._done:
            return True
        # A thread serving a request that waits for a call it made (a nested call) lets another
        # serving thread take the requests that come meanwhile at once: the reply may need one.
        serving = getattr(_serving_thread, "agent", None)
        if serving is not None:
            serving._go_agent.ServeBlocked()
        try:
            return self._wait_for(go_call, seconds)
        finally:
            if serving is not None:
                serving._go_agent.ServeUnblocked()

    def _wait_for(self, go_call: Any, seconds: Optional[float]) -> bool:
        """wait_for's wait, in slices so Ctrl-C gets through."""
        deadline = None if seconds is None else time.monotonic() + seconds
        slices = _interrupts.WaitSlices()
        try:
            while True:
                slice_ms = slices.next_ms()
                if deadline is not None:
                    slice_ms = min(slice_ms, max(0, _to_ms(deadline - time.monotonic())))
                if go_call.Wait(slice_ms, slices.interruptible):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        except BaseException:
            # Interrupted (Ctrl-C): a completion Go saw while this thread waited has no
            # event, so it is settled here.
            if go_call.Wait(0, False):
                self._settle(waiter=True)
            raise
        self._settle(waiter=True)
        return True

    def _settle(self, waiter: bool) -> None:
        """Complete the future from the reply; only the first caller does the work.
        ``waiter``: the caller is a thread waiting on the call (see Future._complete)."""
        with self._settle_lock:
            go_call, self._go_call = self._go_call, None
            table, self._table = self._table, None
        if go_call is None:
            return
        if self._notify_id:  # the event, if one comes, finds nothing left to do
            with self._agent._pending_lock:
                self._agent._pending.pop(self._notify_id, None)
        if table is not None:
            table.release()
        value, exc = None, None
        try:
            value, exc = self._outcome(go_call)
        except BaseException as err:  # a reply that cannot be unpickled fails the call
            exc = err
        self._complete(value, exc, waiter)

    def _outcome(self, go_call: Any) -> Tuple[Any, Optional[BaseException]]:
        s = scratch()
        pickled = self._function is None
        count = go_call.Take(s.table_address, s.TABLE_LEN, s.buf_address, s.BUF_LEN)
        if count >= 0:  # a small reply, or none: taken with that one call
            status, payload, buffers = s.unpack(count, pickled)
        else:
            status = go_call.Status()
            payload, buffers = self._agent._read_message(go_call.Result(), pickled)
        if not pickled:
            return self._function_outcome(go_call, status, payload, buffers)
        if status == _go.StatusOK:
            try:
                return deserialize(payload, buffers), None
            except Exception as err:  # its own type and text, and where it came from
                err.add_note(f"(raised here unpickling the result sent by worker {self._dest})")
                raise
        self.timed_out = status == _go.StatusTimeout
        if status == _go.StatusRemoteError:
            try:
                return None, RemoteException.decode(payload).to_exception(self._prefixed)
            except Exception:
                return None, RuntimeError(f"On worker {self._dest}: {go_call.ErrorMessage()}")
        return None, self._call_error(go_call, status)

    def _function_outcome(self, go_call: Any, status: int, payload: Any, buffers: List[Any]) -> Tuple[Any, Optional[BaseException]]:
        """The outcome of a call of a remote function: msgpack, not pickles."""
        if status == _go.StatusOK:
            try:
                return crosslang.unpack(payload, buffers), None
            except ValueError as exc:
                return None, ValueError(f"the reply of {self._function!r} from worker {self._dest} is malformed: {exc}")
        self.timed_out = status == _go.StatusTimeout
        if status == _go.StatusRemoteError:
            return None, crosslang.error_from(self._dest, go_call.ErrorMessage(), payload)
        if status == _go.StatusNoHandler:
            return None, RuntimeError(f"worker {self._dest} serves no function named {self._function!r}: {go_call.ErrorMessage()}")
        return None, self._call_error(go_call, status)

    def _call_error(self, go_call: Any, status: int) -> RuntimeError:
        text = _CALL_ERRORS.get(status, "{message}")
        return RuntimeError(text.format(dest=self._dest, timeout_ms=self.named_timeout_ms, message=go_call.ErrorMessage()))


class _InternalCallFuture(_CallFuture):
    """The future of a call whose outcome this library takes itself (rpc_sync, remote's
    creation): never a torch one."""

    _internal = True


# What a failed call raises, by Go status (pybind's Status*; OK and RemoteError are handled
# apart). RuntimeError throughout, as torch raises; the text says which failure it was.
# Go's own messages already name the worker for a lost peer and a shutdown.
_CALL_ERRORS: Dict[int, str] = {
    _go.StatusTimeout: (
        "RPC ran for more than set timeout ({timeout_ms} ms) and will now be marked with an error: "
        "the call to worker {dest} timed out"
    ),
    _go.StatusPeerLost: "{message}",
    _go.StatusUnknownWorker: "could not find destination worker {dest}: {message}",
    _go.StatusShutdown: "{message}",
    _go.StatusNoHandler: "worker {dest} does not serve Python calls: {message}",
    _go.StatusCanceled: "the call to worker {dest} was canceled: {message}",
    _go.StatusOther: "{message}",
}

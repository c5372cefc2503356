"""The Python half of a worker: the Go agent, the threads that run incoming calls, and the
thread that completes futures.

Go owns the network and all protocol state. Python threads pull work from Go with calls that
block for at most a slice of time, so Ctrl-C is seen promptly and no Python callable is ever
called from Go.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, Callable, Dict, List, Optional

from ._boundary import SegmentTable, read_segments
from ._native import pybind as _native
from .futures import Future, WAIT_SLICE_S
from .internal import RemoteException, deserialize, raw_buffers, serialize
from .worker_info import WorkerInfo

logger = logging.getLogger(__name__)

_SLICE_MS = int(WAIT_SLICE_S * 1000)

# Message kinds: the first item of every Python-level request.
CALL = "call"


class _PendingCall:
    """An outgoing call whose reply has not been turned into its future's result yet."""

    __slots__ = ("native", "dest", "timeout_ms", "_lock", "_settled")

    def __init__(self, native, dest: str, timeout_ms: int) -> None:
        self.native = native
        self.dest = dest
        self.timeout_ms = timeout_ms
        self._lock = threading.Lock()
        self._settled = False

    def wait_slice(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for the reply; report whether it came."""
        return self.native.Wait(int(seconds * 1000))

    def settle(self, fut: Future) -> None:
        """Complete ``fut`` from the reply; only the first caller does the work."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
        value, exc = None, None
        try:
            value, exc = self._outcome()
        except BaseException as err:  # a reply that cannot be unpickled fails the call
            exc = err
        fut._complete(value, exc)

    def _outcome(self):
        status = self.native.Status()
        if status == _native.StatusOK:
            payload, buffers = read_segments(self.native.Result())
            return deserialize(payload, buffers), None
        if status == _native.StatusRemoteError:
            payload, _ = read_segments(self.native.Result())
            try:
                return None, RemoteException.decode(payload).to_exception()
            except Exception:
                return None, RuntimeError(f"On worker {self.dest}: {self.native.ErrorMessage()}")
        if status == _native.StatusTimeout:
            return None, RuntimeError(
                f"RPC ran for more than set timeout ({self.timeout_ms} ms) and will now be marked "
                f"with an error: the call to worker {self.dest} timed out"
            )
        return None, RuntimeError(self.native.ErrorMessage())


class PythonAgent:
    """One worker's agent: owns the Go agent and the Python threads around it."""

    def __init__(self, native, num_worker_threads: int, rpc_timeout: float) -> None:
        self.native = native
        self.rpc_timeout = rpc_timeout
        self.info = WorkerInfo(native.Name(), native.ID())
        self.workers: List[WorkerInfo] = [
            WorkerInfo(native.WorkerName(i), i) for i in range(native.WorldSize())
        ]
        self._by_name: Dict[str, WorkerInfo] = {w.name: w for w in self.workers}
        self._handlers: Dict[str, Callable[..., Any]] = {CALL: self._run_call}
        self._notify_ids = itertools.count(1)
        self._pending_lock = threading.Lock()
        self._pending: Dict[int, Future] = {}
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._serve_loop, name=f"tensorplay-rpc-worker-{i}", daemon=True)
            for i in range(num_worker_threads)
        ]
        self._completer = threading.Thread(target=self._complete_loop, name="tensorplay-rpc-completions", daemon=True)

    def start(self) -> None:
        """Start running incoming calls and completing futures. Called once the agent is
        installed as the process's agent, since the functions it runs may use the API."""
        for t in self._threads:
            t.start()
        self._completer.start()

    # -- naming ---------------------------------------------------------------------------

    def worker(self, name: str) -> Optional[WorkerInfo]:
        """The worker called ``name``, or None."""
        return self._by_name.get(name)

    # -- outgoing calls -------------------------------------------------------------------

    def send(self, dest: WorkerInfo, message: Any, timeout: float, notify: bool = True) -> Future:
        """Send a Python-level message and return the future of its reply.

        ``timeout`` is in seconds, 0 meaning none. Without ``notify`` the reply is collected
        only by waiting on the future (the rpc_sync fast path).
        """
        data, buffers = serialize(message)
        timeout_ms = 0 if timeout <= 0 else max(1, int(round(timeout * 1000)))
        fut: Future = Future()
        notify_id = next(self._notify_ids) if notify else 0
        if notify:
            with self._pending_lock:
                self._pending[notify_id] = fut
        table = SegmentTable([data] + raw_buffers(buffers))
        try:
            native_call = self.native.Call(dest.id, table.address, table.count, timeout_ms, notify_id)
        except BaseException:
            if notify:
                with self._pending_lock:
                    self._pending.pop(notify_id, None)
            raise
        finally:
            table.release()
        fut._pending_call = _PendingCall(native_call, dest.name, timeout_ms)
        return fut

    def _complete_loop(self) -> None:
        while True:
            notify_id = self.native.NextCompletion(_SLICE_MS)
            if notify_id == 0:
                if self._stopping.is_set():
                    with self._pending_lock:
                        if not self._pending:
                            return
                continue
            with self._pending_lock:
                fut = self._pending.pop(notify_id, None)
            call = fut._pending_call if fut is not None else None
            if call is not None:
                call.settle(fut)

    # -- incoming calls -------------------------------------------------------------------

    def _serve_loop(self) -> None:
        while not self._stopping.is_set():
            request = self.native.NextRequest(_SLICE_MS)
            if request.Valid():
                self._serve(request)

    def _serve(self, request) -> None:
        try:
            payload, buffers = read_segments(request)
            kind, *body = deserialize(payload, buffers)
            result = self._handlers[kind](*body)
            data, out_buffers = serialize(result)
        except BaseException as exc:  # everything the user code raises goes back to the caller
            self._reply_error(request, exc)
            return
        table = SegmentTable([data] + raw_buffers(out_buffers))
        try:
            request.Reply(table.address, table.count)
        finally:
            table.release()

    def _reply_error(self, request, exc: BaseException) -> None:
        detail = RemoteException.capture(exc, repr(self.info)).encode()
        table = SegmentTable([detail])
        try:
            request.Fail(f"{type(exc).__name__}: {exc}", table.address, table.count)
        finally:
            table.release()

    @staticmethod
    def _run_call(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return func(*args, **kwargs)

    # -- shutdown -------------------------------------------------------------------------

    def shutdown(self, graceful: bool, timeout: float) -> None:
        """Leave the world (see ``api.shutdown``); waits in slices so Ctrl-C gets through."""
        self.native.BeginShutdown(graceful, 0 if timeout <= 0 else max(1, int(timeout * 1000)))
        try:
            while not self.native.WaitShutdown(_SLICE_MS):
                pass
        finally:
            self._stopping.set()
            self._completer.join(timeout=5)
            for t in self._threads:
                t.join(timeout=WAIT_SLICE_S * 2)

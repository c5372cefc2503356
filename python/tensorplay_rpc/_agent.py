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
import time
from typing import Any, Callable, Dict, List, Optional

from ._buffers import SegmentTable, read_segments
from ._native import pybind as _native
from .functions import is_async_execution
from .futures import Future, WAIT_SLICE_S
from .internal import Deferred, RemoteException, deserialize, serialize
from .worker_info import WorkerInfo

logger = logging.getLogger(__name__)

_SLICE_MS = int(WAIT_SLICE_S * 1000)
# The agent's own threads need not see Ctrl-C (only the main thread does) and Go wakes them at
# shutdown, so they wait long: an idle worker then costs next to no CPU.
_IDLE_WAIT_MS = 2000

# Message kinds: the first item of every Python-level request.
CALL = "call"  # (CALL, func, args, kwargs): run func, reply with its result
REMOTE = "remote"  # (REMOTE, rref_id, func, args, kwargs): run func, keep the result as an RRef
FETCH = "fetch"  # (FETCH, rref_id): reply with the value of an RRef this worker owns

_current: Optional["PythonAgent"] = None
_current_lock = threading.Lock()


def current_agent() -> Optional["PythonAgent"]:
    """This process's agent, or None before init_rpc and after shutdown."""
    return _current


def require_agent() -> "PythonAgent":
    """This process's agent; raises if RPC is not initialized."""
    agent = _current
    if agent is None:
        raise RuntimeError("RPC has not been initialized. Call tensorplay_rpc.init_rpc first.")
    return agent


def install_agent(agent: Optional["PythonAgent"], expected: Optional["PythonAgent"] = None) -> None:
    """Make ``agent`` the process's agent if the current one is ``expected``; raises if RPC
    is already initialized when installing a new one."""
    global _current
    with _current_lock:
        if agent is not None and _current is not None:
            raise RuntimeError("RPC is already initialized")
        if agent is None and _current is not expected:
            return
        _current = agent


class _PendingCall:
    """An outgoing call whose reply has not been turned into its future's result yet."""

    __slots__ = ("go_call", "go_agent", "dest", "timeout_ms", "table", "_lock", "_settled")

    def __init__(self, go_call, go_agent, dest: str, timeout_ms: int, table: Optional[SegmentTable]) -> None:
        self.go_call = go_call
        self.go_agent = go_agent
        self.dest = dest
        self.timeout_ms = timeout_ms
        # A big request is sent from its buffers in place: they live until the call is done.
        self.table = table
        self._lock = threading.Lock()
        self._settled = False

    def wait_slice(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for the reply; report whether it came."""
        return self.go_call.Wait(int(seconds * 1000))

    def settle(self, fut: Future) -> None:
        """Complete ``fut`` from the reply; only the first caller does the work."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
        if self.table is not None:
            self.table.release()
            self.table = None
        value, exc = None, None
        try:
            value, exc = self._outcome()
        except BaseException as err:  # a reply that cannot be unpickled fails the call
            exc = err
        fut._complete(value, exc)

    def _outcome(self):
        status = self.go_call.Status()
        if status == _native.StatusOK:
            payload, buffers = read_segments(self.go_call.Result(), self.go_agent)
            return deserialize(payload, buffers), None
        if status == _native.StatusRemoteError:
            payload, _ = read_segments(self.go_call.Result(), self.go_agent)
            try:
                return None, RemoteException.decode(payload).to_exception()
            except Exception:
                return None, RuntimeError(f"On worker {self.dest}: {self.go_call.ErrorMessage()}")
        if status == _native.StatusTimeout:
            return None, RuntimeError(
                f"RPC ran for more than set timeout ({self.timeout_ms} ms) and will now be marked "
                f"with an error: the call to worker {self.dest} timed out"
            )
        return None, RuntimeError(self.go_call.ErrorMessage())


def _confirm_creation(created: Future) -> None:
    """The reply to a remote(): nothing, or the creation's error."""
    created.wait()


class PythonAgent:
    """One worker's agent: owns the Go agent and the Python threads around it."""

    def __init__(self, go_agent, num_worker_threads: int, rpc_timeout: float) -> None:
        from .rref import OwnerTable

        self.go_agent = go_agent
        self.rpc_timeout = rpc_timeout
        self.owner_table = OwnerTable()
        self.running = True
        self.info = WorkerInfo(go_agent.Name(), go_agent.ID())
        self.workers: List[WorkerInfo] = [
            WorkerInfo(go_agent.WorkerName(i), i) for i in range(go_agent.WorldSize())
        ]
        self._by_name: Dict[str, WorkerInfo] = {w.name: w for w in self.workers}
        self._handlers: Dict[str, Callable[..., Any]] = {
            CALL: self._run_call,
            REMOTE: self._run_remote,
            FETCH: self._fetch,
        }
        self._notify_ids = itertools.count(1)
        self._pending_lock = threading.Lock()
        self._pending: Dict[int, Future] = {}
        self._threads = [
            threading.Thread(target=self._serve_loop, name=f"tensorplay-rpc-worker-{i}", daemon=True)
            for i in range(num_worker_threads)
        ]
        self._completer = threading.Thread(target=self._event_loop, name="tensorplay-rpc-events", daemon=True)

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

    @property
    def address(self) -> str:
        """The "host:port" this worker listens on for its peers (private: for tests)."""
        return self.native.Addr()

    # -- outgoing calls -------------------------------------------------------------------

    def call(self, dest: WorkerInfo, message: Any, timeout: float, notify: bool = True) -> Future:
        """Send a Python-level message and return the future of its reply.

        ``timeout`` is in seconds: negative means the agent's rpc_timeout, 0 none. Without
        ``notify`` the reply is collected only by waiting on the future (the rpc_sync fast
        path).
        """
        if timeout < 0:
            timeout = self.rpc_timeout
        segments, context = serialize(message)
        # Forks go to their owners before the message that carries them (core/rref.go).
        for owner, rref_id, fork_id in context.forks:
            self.add_fork(owner, rref_id, fork_id, holder=dest.id)
        timeout_ms = 0 if timeout <= 0 else max(1, int(round(timeout * 1000)))
        fut: Future = Future()
        notify_id = next(self._notify_ids) if notify else 0
        if notify:
            with self._pending_lock:
                self._pending[notify_id] = fut
        table = SegmentTable(segments)
        borrowed = table.size >= _native.BorrowThreshold
        try:
            go_call = self.go_agent.Call(dest.id, table.address, table.count, timeout_ms, notify_id)
        except BaseException:
            table.release()
            if notify:
                with self._pending_lock:
                    self._pending.pop(notify_id, None)
            raise
        if not borrowed:
            table.release()
        fut._pending_call = _PendingCall(go_call, self.go_agent, dest.name, timeout_ms, table if borrowed else None)
        return fut

    def add_fork(self, owner: int, rref_id, fork_id, holder: int) -> None:
        """Register an RRef fork held by ``holder`` with the RRef's owner."""
        self.go_agent.AddFork(owner, rref_id[0], rref_id[1], fork_id[0], fork_id[1], holder)

    def _event_loop(self) -> None:
        """Complete futures of calls made with notify, and drop values no one references."""
        while True:
            event = self.go_agent.NextEvent(_IDLE_WAIT_MS)
            if not event.Valid():
                if self.go_agent.Closed():
                    with self._pending_lock:
                        if not self._pending:
                            return
                    time.sleep(WAIT_SLICE_S)  # completions of the last calls are on their way
                continue
            if event.Kind() == _native.EventRRefDropped:
                self.owner_table.drop((event.RRefCreator(), event.RRefLocal()))
                continue
            with self._pending_lock:
                fut = self._pending.pop(event.NotifyID(), None)
            call = fut._pending_call if fut is not None else None
            if call is not None:
                call.settle(fut)

    # -- incoming calls -------------------------------------------------------------------

    def _serve_loop(self) -> None:
        while True:
            request = self.go_agent.NextRequest(_IDLE_WAIT_MS)
            if request.Valid():
                self._serve(request)
            elif self.go_agent.Closed():
                return

    def _serve(self, request) -> None:
        try:
            payload, buffers = read_segments(request, self.go_agent)
            kind, *body = deserialize(payload, buffers)
            result = self._handlers[kind](*body)
        except BaseException as exc:  # everything the user code raises goes back to the caller
            self._reply_error(request, exc)
            return
        if isinstance(result, Deferred):
            result.future.add_done_callback(lambda fut: self._reply_outcome(request, fut))
        else:
            self._reply(request, result)

    def _reply_outcome(self, request, fut: Future) -> None:
        try:
            result = fut.wait()
        except BaseException as exc:
            self._reply_error(request, exc)
            return
        self._reply(request, result)

    def _reply(self, request, result: Any) -> None:
        try:
            segments, context = serialize(result)
            for owner, rref_id, fork_id in context.forks:
                self.add_fork(owner, rref_id, fork_id, holder=request.CallerID())
        except BaseException as exc:  # an unpicklable result fails the call, not the worker
            self._reply_error(request, exc)
            return
        table = SegmentTable(segments)
        try:
            request.Reply(table.address, table.count)
        finally:
            table.release()

    def _reply_error(self, request, exc: BaseException) -> None:
        try:
            summary = f"{type(exc).__name__}: {exc}"
        except Exception:  # an exception whose str() fails still gets reported
            summary = type(exc).__name__
        detail = RemoteException.capture(exc, repr(self.info)).encode()
        table = SegmentTable([detail])
        try:
            request.Fail(summary, table.address, table.count)
        finally:
            table.release()

    @staticmethod
    def _run_call(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        result = func(*args, **kwargs)
        if is_async_execution(func):
            if not isinstance(result, Future):
                raise TypeError(
                    f"async_execution function {getattr(func, '__qualname__', func)} must return a Future, "
                    f"got {type(result).__name__}"
                )
            return Deferred(result)
        return result

    def _run_remote(self, rref_id, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Create an RRef's value; the reply (None, or the creation's error) confirms it."""
        slot = self.owner_table.creation_slot(tuple(rref_id))
        try:
            result = self._run_call(func, args, kwargs)
        except BaseException as exc:
            slot._complete(None, exc)
            raise
        if isinstance(result, Deferred):
            result.future.add_done_callback(lambda fut: slot._complete(fut._result, fut._exception))
            return Deferred(result.future.then(_confirm_creation))
        slot._complete(result, None)
        return None

    def _fetch(self, rref_id) -> Deferred:
        return Deferred(self.owner_table.slot(tuple(rref_id)))

    # -- shutdown -------------------------------------------------------------------------

    def shutdown(self, graceful: bool, timeout: float) -> None:
        """Leave the world (see ``api.shutdown``); waits in slices so Ctrl-C gets through."""
        self.go_agent.BeginShutdown(graceful, 0 if timeout <= 0 else max(1, int(timeout * 1000)))
        try:
            while not self.go_agent.WaitShutdown(_SLICE_MS):
                pass
        except BaseException:
            # Ctrl-C: Go finishes closing on its own; the threads are daemons and end with it.
            self.running = False
            raise
        self.running = False
        self._completer.join(timeout=5)
        for t in self._threads:
            t.join(timeout=WAIT_SLICE_S * 2)

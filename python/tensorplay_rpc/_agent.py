"""The Python half of a worker: the Go agent, the threads that run incoming calls, and the
thread that completes futures.

Go owns the network and all protocol state. Python threads pull work from Go with calls that
block for at most a slice of time, so Ctrl-C is seen promptly and no Python callable is ever
called from Go.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

from . import _dist_autograd, _interrupts, _torch_store, constants, crosslang
from ._call_future import _CallFuture, release_abandoned, _InternalCallFuture, _serving_thread, _to_ms, _wait_on_go, call_timeout
from ._go_logs import forward_go_logs
from ._buffers import BufferLike, SegmentTable, came_as_bytes, lent_view, new_bytearray, new_bytes, scratch
from ._native import pybind as _go
from ._owner_table import Id, OwnerTable
from .constants import WAIT_SLICE_S
from .functions import Deferred, run_function
from .futures import Future, run_on_callback_thread, wait_all, wait_for_callbacks
from .internal import FrameworkError, RemoteException, exception_text, deserialize, serialize
from .options import TensorPipeRpcBackendOptions
from .worker_info import WorkerInfo

logger = logging.getLogger(__name__)

# The agent's own threads need not see Ctrl-C (only the main thread does) and Go wakes them at
# shutdown, so they wait long: an idle worker then costs next to no CPU.
_IDLE_WAIT_MS = 2000

# Message kinds: the first item of every Python-level request.
_CALL = "call"  # (_CALL, func, args, kwargs): run func, reply with its result
_REMOTE = "remote"  # (_REMOTE, rref_id, func, args, kwargs): run func, keep the result as an RRef
_FETCH = "fetch"  # (_FETCH, rref_id): reply with the value of an RRef this worker owns

# What a call message carries: (func, args, kwargs), made by function_call.
FunctionCall = Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]


def function_call(func: Callable[..., Any], args: Optional[Tuple[Any, ...]], kwargs: Optional[Dict[str, Any]]) -> FunctionCall:
    """The function call a message carries, checked and with defaults filled in: the one
    builder for rpc_sync, rpc_async, remote and the RRef proxies."""
    if not callable(func):
        raise TypeError("function should be callable.")
    # Passed as given, as torch does: arguments of the wrong kind fail on the callee, with
    # Python's own TypeError from the call.
    return func, () if args is None else args, {} if kwargs is None else kwargs


_collecting = threading.local()


def collect_for_wait_all(fut: Future[Any]) -> None:
    """Hand ``fut`` to the ``api._wait_all()`` block this thread is in, if any."""
    collected: Optional[List[Future[Any]]] = getattr(_collecting, "futures", None)
    if collected is not None:
        collected.append(fut)


@contextlib.contextmanager
def wait_all_on_exit() -> Iterator[None]:
    """Collect the futures of rpc_async calls (and async proxy calls) made on this thread
    inside the block, and wait for them all on its way out (``api._wait_all``)."""
    _collecting.futures = []
    try:
        yield
    finally:
        try:
            wait_all(_collecting.futures)
        finally:
            del _collecting.futures


_current: Optional["TensorPipeAgent"] = None
_current_lock = threading.Lock()


def current_agent() -> Optional["TensorPipeAgent"]:
    """This process's agent, or None before init_rpc and after shutdown."""
    return _current


def current_agent_or_not_set() -> "TensorPipeAgent":
    """This process's agent; raises torch's "agent is not set" error before init_rpc."""
    agent = _current
    if agent is None:
        raise RuntimeError(constants.AGENT_NOT_SET)
    return agent


def require_agent() -> "TensorPipeAgent":
    """This process's agent; raises if RPC is not initialized."""
    agent = _current
    if agent is None:
        raise RuntimeError("RPC has not been initialized. Call tensorplay_rpc.init_rpc first.")
    return agent


def install_agent(agent: Optional["TensorPipeAgent"], expected: Optional["TensorPipeAgent"] = None) -> None:
    """Make ``agent`` the process's agent if the current one is ``expected``; raises if RPC
    is already initialized when installing a new one."""
    global _current
    with _current_lock:
        if agent is not None and _current is not None:
            raise RuntimeError("RPC is already initialized")
        if agent is None and _current is not expected:
            return
        _current = agent


def _message_size(segments: List[Any]) -> int:
    """The bytes a message of ``segments`` carries, as Go counts them."""
    return sum(len(seg) if type(seg) is bytes else memoryview(seg).nbytes for seg in segments)


# The reply to a remote() confirms the creation: None, or the value itself in a 1-tuple if it
# is immutable and small. Such a value cannot change on its owner, so to_here() returns it
# without a second round trip; a fetch would send the same bytes.
_INLINE_MAX = 1024  # characters, bytes, or bytes of an int; items of a tuple: 64


def _inlinable(value: Any, depth: int = 0) -> bool:
    kind = type(value)  # exact types: a subclass may carry mutable state
    if kind is str or kind is bytes:
        return len(value) <= _INLINE_MAX
    if kind is int:
        return int.bit_length(value) <= 8 * _INLINE_MAX
    if value is None or kind is bool or kind is float or kind is complex:
        return True
    if kind is tuple:
        return depth < 4 and len(value) <= 64 and all(_inlinable(v, depth + 1) for v in value)
    return False


def _creation_reply(value: Any) -> Optional[Tuple[Any]]:
    return (value,) if _inlinable(value) else None


def _confirm_creation(created: Future[Any]) -> Optional[Tuple[Any]]:
    """The reply to a remote() of an async function: its creation's error, or as
    _creation_reply."""
    return _creation_reply(created.wait())


# How often, at most, a dynamic world's agent reads the membership for a worker it does not
# know, and how long it waits for the store.
REFRESH_EVERY_S = 0.1
REFRESH_TIMEOUT_MS = 2000


class RpcAgent:
    """What every RPC agent offers (torch's ``RpcAgent``); :class:`TensorPipeAgent` is the
    one this package has. ``_get_current_rpc_agent()`` returns this process's."""

    info: WorkerInfo

    def get_worker_info(self, worker: "Optional[str | int]" = None) -> WorkerInfo:
        """The WorkerInfo of this worker, or of the worker of that name or id."""
        return self.info if worker is None else self.destination(worker)

    def destination(self, to: "str | int | WorkerInfo") -> WorkerInfo:
        """The worker ``to`` names, as torch resolves a destination: by name, by id (a bool
        too), or a WorkerInfo by its name (its id is not checked)."""
        me = self.info
        if isinstance(to, WorkerInfo):
            found = self.worker(to.name)
            if found is None:
                raise RuntimeError(f"name:{me.name},rank:{me.id} could not find destination url for name {to.name}")
            return found
        if isinstance(to, str):
            found = self.worker(to)
            if found is None:
                raise RuntimeError(f"name:{me.name},rank:{me.id} could not find destination name {to}")
            return found
        if isinstance(to, int):
            found = self.worker_by_id(int(to))
            if found is None:
                raise RuntimeError(f"name:{me.name},rank:{me.id} could not find destination id {int(to)}")
            return found
        raise ValueError(f"Cannot get WorkerInfo from name {to}")

    def get_worker_infos(self) -> List[WorkerInfo]:
        """The WorkerInfo of every worker of the world now, by id."""
        raise NotImplementedError

    def worker(self, name: str) -> Optional[WorkerInfo]:
        """The worker called ``name``, or None."""
        raise NotImplementedError

    def worker_by_id(self, worker_id: int) -> Optional[WorkerInfo]:
        """The worker of that id, or None."""
        raise NotImplementedError

    def get_debug_info(self) -> Dict[str, str]:
        """Counters of this agent, by name, as strings (torch's keys where they mean the same)."""
        raise NotImplementedError


class TensorPipeAgent(RpcAgent):
    """One worker's agent: owns the Go agent and the Python threads around it."""

    def __init__(self, go_agent: Any, num_worker_threads: int, rpc_timeout: float, is_static_group: bool = True) -> None:
        self._go_agent = go_agent
        self.rpc_timeout = rpc_timeout
        self.owner_table = OwnerTable()
        #: The RRefs this worker holds to values other workers own (rref.PyRRef), released
        #: to their owners by a graceful shutdown, as torch's deletes every user RRef.
        self.user_rrefs: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.running = True
        #: False for a dynamic world (``init_rpc(world_size=None)``), as torch's attribute.
        self.is_static_group = is_static_group
        #: Where this world met, if through torch's store; rank 0's serves later joiners.
        self.torch_meeting: Optional[_torch_store.TorchMeeting] = None
        #: host:port of this worker's Prometheus endpoint, if it serves one.
        self.metrics_address: Optional[str] = None
        self.info = WorkerInfo(go_agent.Name(), go_agent.ID())
        self._world_version = -1
        self._last_refresh = 0.0
        # (by id, by name), replaced whole: readers on other threads see one view or the next.
        self._maps: Tuple[Dict[int, WorkerInfo], Dict[str, WorkerInfo]] = ({}, {})
        self._load_world()
        self._handlers: Dict[str, Callable[..., Any]] = {
            _CALL: run_function,
            _REMOTE: self._run_remote,
            _FETCH: self._fetch,
        }
        self._notify_ids = itertools.count(1)
        self._pending_lock = threading.Lock()
        self._pending: Dict[int, _CallFuture] = {}
        self._threads = [
            threading.Thread(target=self._serve_loop, name=f"tensorplay-rpc-worker-{i}", daemon=True)
            for i in range(num_worker_threads)
        ]
        self._completer = threading.Thread(target=self._event_loop, name="tensorplay-rpc-events", daemon=True)

    def start(self) -> None:
        """Start running incoming calls and completing futures. Called once the agent is
        installed as the process's agent, since the functions it runs may use the API."""
        # Names exposed while the worker joined (after start_agent read them) are served too.
        crosslang.watch_exposed(self._expose)
        for name in [*crosslang.exposed_names(), crosslang.IMPORTS]:
            self._expose(name)
        for t in self._threads:
            t.start()
        self._completer.start()

    # -- naming ---------------------------------------------------------------------------

    def _load_world(self) -> None:
        """Read the world from Go if it changed since last read (only a dynamic world's
        does)."""
        version = self._go_agent.WorldVersion()
        if version == self._world_version:
            return
        by_id: Dict[int, WorkerInfo] = {}
        for line in self._go_agent.Members().splitlines():
            worker_id, name = line.split(" ", 1)
            by_id[int(worker_id)] = WorkerInfo(name, int(worker_id))
        self._maps = (by_id, {w.name: w for w in by_id.values()})
        self._world_version = version

    def _world(self) -> Tuple[Dict[int, WorkerInfo], Dict[str, WorkerInfo]]:
        """The world now: its workers by id and by name."""
        if not self.is_static_group:
            self._load_world()
        return self._maps

    def worker(self, name: str) -> Optional[WorkerInfo]:
        """The worker called ``name``, or None."""
        found = self._world()[1].get(name)
        if found is None and self._refreshed():
            found = self._world()[1].get(name)
        return found

    def worker_by_id(self, worker_id: int) -> Optional[WorkerInfo]:
        """The worker of that id, or None."""
        found = self._world()[0].get(worker_id)
        if found is None and self._refreshed():
            found = self._world()[0].get(worker_id)
        return found

    def _refreshed(self) -> bool:
        """On a miss in a dynamic world, read the membership from the store (this worker
        may have missed a join while it was frozen), at most every REFRESH_EVERY_S; whether it
        did."""
        now = time.monotonic()
        if self.is_static_group or now - self._last_refresh < REFRESH_EVERY_S:
            return False
        self._last_refresh = now
        try:
            self._go_agent.RefreshWorld(REFRESH_TIMEOUT_MS)
        except RuntimeError as exc:
            logger.debug("could not read the membership: %s", exc)
            return False
        return True

    def get_worker_infos(self) -> List[WorkerInfo]:
        """The WorkerInfo of every worker of the world now, by id (a dynamic world's change
        as workers join and leave)."""
        return list(self._world()[0].values())

    def member_epoch(self, worker_id: int) -> int:
        """Identifies the worker of that id now: -1 if there is none, another value once it
        left a dynamic world and joined again (0 throughout a static world)."""
        if self.is_static_group:
            return 0
        epoch: int = self._go_agent.MemberEpoch(worker_id)
        return epoch

    def get_debug_info(self) -> Dict[str, str]:
        """Counters of this agent, by name, as strings (torch's keys where they mean the same)."""
        owned_values, owned_entries = self.owned_rref_count()
        return {
            "num_owner_rrefs": str(owned_values),
            "num_owner_rref_entries": str(owned_entries),
            "agent.pending_callbacks": str(self.pending_futures()),
            "agent.thread_pool_size": str(len(self._threads)),
            "agent.lent_messages": str(self.lent_messages()),
            "agent.goroutines": str(self.goroutines()),
        }

    @property
    def address(self) -> str:
        """The "host:port" this worker listens on for its peers (private: for tests)."""
        addr: str = self._go_agent.Addr()
        return addr

    # -- outgoing calls -------------------------------------------------------------------

    def rpc_async(self, dest: WorkerInfo, call: FunctionCall, timeout: float, internal: bool = False) -> Future[Any]:
        """Run ``call`` on worker ``dest``; the future of its result (``internal``: see _send)."""
        return self._send(dest, (_CALL, *call), timeout, internal=internal)

    def rpc_sync(self, dest: WorkerInfo, call: FunctionCall, timeout: float) -> Any:
        """Run ``call`` on worker ``dest`` and return its result. The reply is collected by
        this thread, not the event thread: one hand-off fewer."""
        return self._send(dest, (_CALL, *call), timeout, internal=True).wait()

    def remote(self, dest: WorkerInfo, call: FunctionCall, timeout: float) -> Tuple[Id, Id, _CallFuture]:
        """Run ``call`` on worker ``dest`` and keep the result there as an RRef. Returns the
        RRef's id, the id of this worker's fork (already registered with ``dest``), and the
        future of the creation."""
        timeout = self._timeout(timeout)  # a bad one is refused before any fork exists
        rref_id, fork_id = self.new_id(), self.new_id()
        self.add_fork(dest.id, rref_id, fork_id, holder=self.info.id)
        try:
            creation = self._send(dest, (_REMOTE, rref_id, *call), timeout, prefixed=False, internal=True)
        except BaseException:
            self.release_fork(dest.id, rref_id, fork_id)  # no RRef object will hold it
            raise
        return rref_id, fork_id, creation

    def remote_function(self, dest: WorkerInfo, fn: crosslang.RemoteFunction, args: Optional[Tuple[Any, ...]], kwargs: Optional[Dict[str, Any]], timeout: float) -> Tuple[Id, Id, _CallFuture]:
        """``remote()`` of a function ``dest`` serves by name: as :meth:`remote`, but the value
        is kept by ``dest``'s Go agent, in msgpack (see crosslang)."""
        timeout = self._timeout(timeout)  # a bad one is refused before any fork exists
        rref_id, fork_id = self.new_id(), self.new_id()
        segments = crosslang.encode_remote(rref_id, fn, args, kwargs)
        self.add_fork(dest.id, rref_id, fork_id, holder=self.info.id)
        try:
            fut = _InternalCallFuture(self, dest.name, timeout, prefixed=False, function=fn.name)
            creation = self._call(dest, _go.RemoteMethod, segments, fut)
        except BaseException:
            self.release_fork(dest.id, rref_id, fork_id)
            raise
        return rref_id, fork_id, creation

    def fetch(self, owner: WorkerInfo, rref_id: Id, timeout: float, function: Optional[str] = None, named_timeout: Optional[float] = None) -> Future[Any]:
        """The future of a copy of the value of RRef ``rref_id``, from its owner; ``function``
        names the function that made it if it was made by name (kept in msgpack).
        ``named_timeout``, if given, is the timeout its timeout error names (``timeout`` is
        what is left of it)."""
        if function is None:
            fut = self._send(owner, (_FETCH, rref_id), timeout, prefixed=False, internal=True)
        else:
            fut = _InternalCallFuture(self, owner.name, self._timeout(timeout), prefixed=False, function=function)
            self._call(owner, _go.FetchMethod, crosslang.pack(list(rref_id), "an RRef id"), fut)
        if named_timeout is not None:
            fut.named_timeout_ms = _to_ms(named_timeout)
        return fut

    def _send(self, dest: WorkerInfo, message: Any, timeout: float, prefixed: bool = True, internal: bool = False) -> "_CallFuture":
        """Send a Python-level message and return the future of its reply.

        ``timeout`` is in seconds: negative means the agent's rpc_timeout, 0 none. ``prefixed``:
        see RemoteException.to_exception (False for what to_here() raises). ``internal``: the
        future is not handed to user code (never a torch one).
        """
        autograd_context = _dist_autograd.outgoing_context()
        if autograd_context is None:
            segments, context = serialize(message)
        else:  # recorded for distributed autograd: see _dist_autograd
            message = _dist_autograd.wrap(message, autograd_context, dest.id, reply=False)
            segments, context = serialize(message, record_grads=True)
            _dist_autograd.record_sends(message, context.grad_tensors)
        # Forks go to their owners before the message that carries them (core/rref.go), unless
        # it will be refused before it leaves (over the size limit, say): dest would never hold
        # them. (_call fails the call the same way.)
        if context.forks and not self._go_agent.WouldRefuse(dest.id, _go.PyMethod, _message_size(segments)):
            for owner, rref_id, fork_id in context.forks:
                self.add_fork(owner, rref_id, fork_id, holder=dest.id)
        future_class = _InternalCallFuture if internal else _CallFuture
        fut = self._call(dest, _go.PyMethod, segments, future_class(self, dest.name, self._timeout(timeout), prefixed))
        go_call = fut._go_call  # read once: the event thread may settle the call meanwhile
        if context.forks and go_call is not None and go_call.Refused():
            # Refused before it left for a reason that came meanwhile (a shutdown): take back
            # the registrations not sent yet.
            for owner, rref_id, fork_id in context.forks:
                self._go_agent.RetractFork(owner, rref_id[0], rref_id[1], fork_id[0], fork_id[1], dest.id)
        return fut

    def call_function(self, dest: WorkerInfo, fn: crosslang.RemoteFunction, args: Optional[Tuple[Any, ...]], kwargs: Optional[Dict[str, Any]], timeout: float, internal: bool = False) -> Future[Any]:
        """The future of a call of the function ``dest`` serves as ``fn.name``, in msgpack
        (``internal``: as for :meth:`_send`)."""
        segments = crosslang.encode_call(fn, args, kwargs)
        future_class = _InternalCallFuture if internal else _CallFuture
        fut = future_class(self, dest.name, self._timeout(timeout), prefixed=False, function=fn.name)
        return self._call(dest, fn.name, segments, fut)

    def _timeout(self, timeout: float) -> float:
        """A call's timeout in seconds: negative means the agent's rpc_timeout, 0 none."""
        return call_timeout(timeout, self.rpc_timeout)

    def _call(self, dest: WorkerInfo, method: str, segments: List[Any], fut: "_CallFuture") -> "_CallFuture":
        """Send the message of ``segments`` to ``method`` on ``dest``; ``fut`` gets the reply."""
        table = SegmentTable(segments)
        # Decided here only, and Go obeys: a big message is sent from Python's memory in place,
        # so its buffers must live until the call is done.
        borrowed = table.size >= _go.BorrowThreshold
        try:
            go_call = self._go_agent.Call(dest.id, method, table.address, table.count, borrowed, fut._timeout_ms)
        except BaseException:
            table.release()
            raise
        if not borrowed:
            table.release()
        fut._attach(go_call, table if borrowed else None)
        return fut

    # -- RRef bookkeeping in Go -----------------------------------------------------------

    def new_id(self) -> Id:
        """A new id for an RRef or a fork: no other made by any worker is equal to it."""
        return (self.info.id, self._go_agent.NewLocalID())

    def add_fork(self, owner: int, rref_id: Id, fork_id: Id, holder: int) -> None:
        """Register an RRef fork held by ``holder`` with the RRef's owner."""
        self._go_agent.AddFork(owner, rref_id[0], rref_id[1], fork_id[0], fork_id[1], holder)

    def release_fork(self, owner: int, rref_id: Id, fork_id: Id) -> None:
        """Tell the RRef's owner this worker dropped a fork; does not block."""
        self._go_agent.ReleaseFork(owner, rref_id[0], rref_id[1], fork_id[0], fork_id[1])

    def metrics(self) -> Dict[str, Any]:
        """A snapshot of this worker's traffic and memory (see ``api.metrics``)."""
        snapshot: Dict[str, Any] = json.loads(self._go_agent.MetricsJSON())
        snapshot["lent_messages"] = self.lent_messages()
        snapshot["pending_futures"] = self.pending_futures()
        return snapshot

    def owned_rref_count(self) -> Tuple[int, int]:
        """RRefs this worker owns: values kept by Python, entries counted by Go."""
        return len(self.owner_table), self._go_agent.OwnedRRefs()

    # -- leak checks (tests) --------------------------------------------------------------

    def lent_messages(self) -> int:
        """Received messages whose memory Python still uses in place."""
        lent: int = self._go_agent.Lent()
        return lent

    def goroutines(self) -> int:
        """Goroutines in this process."""
        goroutines: int = self._go_agent.Goroutines()
        return goroutines

    def pending_futures(self) -> int:
        """Futures whose callbacks wait for the event thread to complete them."""
        with self._pending_lock:
            return len(self._pending)

    # -- events ---------------------------------------------------------------------------

    def _event_loop(self) -> None:
        """Hand futures that have callbacks and no waiting thread to the callback threads, and
        drop values no one references."""
        handled = False
        while True:
            event = self._go_agent.NextEvent(_IDLE_WAIT_MS, handled)
            handled = event != 0
            if not handled:
                if self._go_agent.Closed():
                    with self._pending_lock:
                        if not self._pending:
                            return
                    time.sleep(WAIT_SLICE_S)  # completions of the last calls are on their way
                continue
            try:
                self._handle_event(event)
            except Exception:  # a bug (or a logging filter that raises) must not end this thread
                logger.exception("handling an event failed")

    def _handle_event(self, event: int) -> None:
        """``event`` is what NextEvent gave: a completed call's notify id (or an abandoned
        request's, see _abandon), or minus the kind of another event."""
        if release_abandoned(event):
            return
        if event > 0:
            with self._pending_lock:
                fut = self._pending.pop(event, None)
            if fut is not None:
                # Settled and its callbacks run on a callback thread, not here: a slow
                # callback must not hold up other calls' completions.
                run_on_callback_thread(functools.partial(fut._settle, False))
        elif -event == _go.EventLogs:
            forward_go_logs()
        elif -event == _go.EventRRefsDropped:
            dropped = self._go_agent.TakenEvent()
            for i in range(dropped.Dropped()):
                self.owner_table.drop((dropped.RRefCreator(i), dropped.RRefLocal(i)))

    # -- incoming calls -------------------------------------------------------------------

    def _serve_loop(self) -> None:
        _serving_thread.agent = self
        served = False
        while True:
            go_request = self._go_agent.NextRequest(_IDLE_WAIT_MS, served)
            served = go_request.Valid()
            if served:
                try:
                    self._serve(go_request)
                except Exception:  # a bug here must not end the thread that serves calls
                    logger.exception("serving a call failed")
            elif self._go_agent.Closed():
                return

    def _serve(self, go_request: Any) -> None:
        try:
            s = scratch()
            count = go_request.Take(s.table_address, s.TABLE_LEN, s.buf_address, s.BUF_LEN)
            if count >= 0:  # a small request: taken with that one call, its kind first
                pickled = s.table[0] == _go.RequestPickled
                _, payload, buffers = s.unpack(count, pickled)
            else:
                pickled = go_request.Method() == _go.PyMethod
                payload, buffers = self._read_message(go_request, pickled)
            if not pickled:  # only calls by name ask for the method: one boundary call fewer
                self._serve_function(go_request, go_request.Method(), payload, buffers)
                return
            kind, *body = deserialize(payload, buffers)
            del payload, buffers
            autograd_context = _dist_autograd.take_received_context()
            if autograd_context is not None:  # a request made in a distributed autograd context
                self._serve_in_context(go_request, autograd_context, kind, body)
                return
            result = self._handlers[kind](*body)
            # The request's memory goes back to Go before the reply leaves: a caller that sends
            # its next big request at once finds the buffer free instead of faulting in another.
            del body
        except BaseException as exc:  # everything the user code raises goes back to the caller
            self._reply_error(go_request, exc)
            return
        if isinstance(result, Deferred):
            result.future.add_done_callback(lambda fut: self._reply_outcome(go_request, fut))
        else:
            self._reply(go_request, result)

    def _serve_in_context(self, go_request: Any, autograd_context: int, kind: str, body: List[Any]) -> None:
        """Run a request made in a distributed autograd context in that context, so its own RPCs
        and its reply are recorded in it (an async_execution function's reply too)."""
        with _dist_autograd.entered(autograd_context):
            try:
                result = self._handlers[kind](*body)
                del body
            except BaseException as exc:
                self._reply_error(go_request, exc)
                return
            if isinstance(result, Deferred):
                result.future.add_done_callback(lambda fut: self._reply_outcome(go_request, fut, autograd_context))
            else:
                self._reply(go_request, result, autograd_context)

    def _serve_function(self, go_request: Any, name: str, payload: Any, buffers: List[Any]) -> None:
        """Run the function exposed as ``name`` (crosslang.expose) for a caller in any language."""
        try:
            reply = crosslang.serve(name, payload, buffers)
        except BaseException as exc:
            self._fail(go_request, f"{type(exc).__name__}: {exception_text(exc)}", crosslang.error_detail(exc))
            return
        self._send_reply(go_request, reply)

    def _expose(self, name: str) -> None:
        """Serve the function exposed as ``name`` from now on (crosslang.IMPORTS: follow
        crosslang.expose_imports)."""
        if name == crosslang.IMPORTS:
            self._go_agent.ExposeImports(crosslang.imports_allowed())
        else:
            self._go_agent.Expose(name)

    def _read_message(self, go_segments: Any, pickled: bool = True) -> Tuple[BufferLike, List[BufferLike]]:
        """Take a received message (a request, a reply) out of Go: its payload and out-of-band
        buffers. A message in one pooled Go buffer is used in place and handed back when the
        last view of it dies; any other is copied into objects Python allocates. The last
        segment of a ``pickled`` message records each buffer's kind (internal.serialize); a
        message of a remote function (crosslang) has none, and all its buffers are writable."""
        count = go_segments.NumSegments()
        sizes = [go_segments.SegmentSize(i) for i in range(count)]
        if count == 1:
            payload, address = new_bytearray(sizes[0])
            if sizes[0]:
                go_segments.CopySegment(0, address)
            go_segments.Release()
            return payload, []
        kinds: bytes = b""
        data_sizes = sizes
        if pickled:
            kinds, address = new_bytes(sizes[-1])
            go_segments.CopySegment(count - 1, address)
            data_sizes = sizes[:-1]
        # A message in one pooled buffer is lent in place; bytes, and every segment of any
        # other message, are copied by Go (which readies a big new object's pages first).
        base = go_segments.Lend()
        view = lent_view(base, sum(sizes), functools.partial(self._go_agent.Return, go_segments.LendID())) if base else None
        parts: List[BufferLike] = []
        offset = 0
        for i, size in enumerate(data_sizes):
            as_bytes = came_as_bytes(kinds, i)
            if view is not None and not as_bytes:
                parts.append(view[offset : offset + size])
            else:
                buf, address = new_bytes(size) if as_bytes else new_bytearray(size)
                if size:
                    go_segments.CopySegment(i, address)
                parts.append(buf)
            offset += size
        if view is None:
            go_segments.Release()
        return parts[0], parts[1:]

    def _reply_outcome(self, go_request: Any, fut: Future[Any], autograd_context: Optional[int] = None) -> None:
        try:
            result = fut.wait()
        except BaseException as exc:
            self._reply_error(go_request, exc)
            return
        self._reply(go_request, result, autograd_context)

    def _reply(self, go_request: Any, result: Any, autograd_context: Optional[int] = None) -> None:
        """Answer ``go_request`` with ``result`` (recorded in ``autograd_context``, if the
        request came in one that this worker still has)."""
        try:
            if autograd_context is not None and _dist_autograd.is_valid_context(autograd_context):
                result = _dist_autograd.wrap(result, autograd_context, go_request.CallerID(), reply=True)
                segments, context = serialize(result, record_grads=True)
                _dist_autograd.record_sends(result, context.grad_tensors)
            else:
                segments, context = serialize(result)
            for owner, rref_id, fork_id in context.forks:
                self.add_fork(owner, rref_id, fork_id, holder=go_request.CallerID())
        except BaseException as exc:  # an unpicklable result fails the call, not the worker
            self._reply_error(go_request, FrameworkError(f"{type(exc).__name__}: {exception_text(exc)}"))
            return
        self._send_reply(go_request, segments)

    def _send_reply(self, go_request: Any, segments: List[Any]) -> None:
        """Answer ``go_request`` with the message of ``segments``."""
        table = SegmentTable(segments)
        try:
            # A borrowed reply is sent before Reply returns, so the table is released after.
            go_request.Reply(table.address, table.count, table.size >= _go.BorrowThreshold)
        finally:
            table.release()

    def _reply_error(self, go_request: Any, exc: BaseException) -> None:
        summary = f"{type(exc).__name__}: {exception_text(exc)}"
        self._fail(go_request, summary, RemoteException.capture(exc, repr(self.info)).encode())

    def _fail(self, go_request: Any, summary: str, detail: bytes) -> None:
        table = SegmentTable([detail])
        try:
            go_request.Fail(summary, table.address, table.count)
        finally:
            table.release()

    def _run_remote(self, rref_id: Id, func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Create an RRef's value; the reply (see _creation_reply, or the creation's error)
        confirms it."""
        # tuple(): the id as the table's key, whatever sequence the peer sent (unchecked: cast)
        slot = self.owner_table.creation_slot(cast(Id, tuple(rref_id)))
        try:
            result = run_function(func, args, kwargs)
        except BaseException as exc:
            slot._complete(None, exc)
            raise
        if isinstance(result, Deferred):

            def settle(fut: Future[Any]) -> None:
                slot._complete(fut._result, fut._exception)

            result.future.add_done_callback(settle)
            return Deferred(result.future._chain(_confirm_creation))
        slot._complete(result, None)
        return _creation_reply(result)

    def _fetch(self, rref_id: Id) -> Deferred:
        return Deferred(self.owner_table.slot(cast(Id, tuple(rref_id))))

    # -- shutdown -------------------------------------------------------------------------

    def shutdown(self, graceful: bool, timeout: float) -> None:
        """Leave the world (see ``api.shutdown``); waits in slices so Ctrl-C gets through."""
        crosslang.watch_exposed(self._expose, on=False)
        self._go_agent.BeginShutdown(graceful, _to_ms(timeout))
        failure: Optional[RuntimeError] = None
        try:
            _wait_on_go(self._go_agent.WaitDrained)
            if self._go_agent.Drained():
                # The barrier is over: no worker calls any more, so no handler uses an RRef.
                # Their owners then hold no forks of a worker about to be gone.
                for rref in list(self.user_rrefs):
                    rref._release()
                self._go_agent.UserRRefsReleased()
            _wait_on_go(self._go_agent.WaitShutdown)
        except RuntimeError as exc:
            # Go's shutdown ended with an error, and closed the agent all the same: this side
            # closes too before saying so, or the worker would be left half shut down.
            failure = exc
        except BaseException:
            # Ctrl-C: Go finishes closing on its own; the threads are daemons and end with it.
            self.running = False
            raise
        finally:
            _interrupts.disarm()
        self.running = False
        _dist_autograd.release_all()  # their peers are gone or going too
        self._completer.join(timeout=5)
        # As torch's: the callbacks of the calls completed have run when shutdown returns.
        if not wait_for_callbacks(5):
            logger.warning("shutdown: futures' callbacks still running after 5 s; not waiting for them")
        for t in self._threads:
            t.join(timeout=WAIT_SLICE_S * 2)
        forward_go_logs()  # what shutting down logged
        if failure is not None:
            if not self._go_agent.ShutdownTimedOut():
                raise failure
            # As torch's: a graceful shutdown given a timeout waits that long for the others,
            # then leaves without them (and says whom it left).
            logger.warning("shutdown: %s; this worker left without them", failure)


def start_agent(store: str, name: str, rank: int, world_size: int, options: TensorPipeRpcBackendOptions) -> TensorPipeAgent:
    """Join the world as worker ``name`` through the rendezvous store at ``store``
    (``tcp://host:port`` or ``file:///path``) and return the agent, not yet serving.

    The join waits in slices, so Ctrl-C stops one that waits on a missing worker."""
    init_timeout = options.rpc_timeout if options.rpc_timeout > 0 else constants.DEFAULT_RPC_TIMEOUT_SEC
    if world_size > 0 and rank >= world_size:
        # Go refuses it too (core.Agent's config check, in the same words), but a torch store
        # meeting would first wait for a rank 0 that may never come.
        raise RuntimeError(f"rank {rank} is out of range for world_size {world_size}: ranks run from 0 to {world_size - 1}")
    meeting = _torch_store.meeting_for(store, rank, init_timeout)
    if meeting is not None:
        store = meeting.free_port_url() if rank == 0 else meeting.read()
    starter = _go.BeginStart(
        name,
        rank,
        world_size,
        store,
        _to_ms(init_timeout),
        options.max_message_size,
        # Read here, not by Go: Go sees only the environment the process started with.
        options.token or os.environ.get("TENSORPLAY_RPC_TOKEN", ""),
        options.tls_cert or "",
        options.tls_key or "",
        options.tls_ca or "",
        ",".join(options.transport_names()),
        "\n".join(crosslang.exposed_names()),
    )
    try:
        if meeting is not None and rank == 0:
            served = ""
            while not served and not starter.Wait(0, False):
                served = starter.ServedStore(_interrupts.SHORT_SLICE_MS)
            if served:
                meeting.publish(served)
        _wait_on_go(starter.Wait)
    except BaseException:
        starter.Cancel()
        forward_go_logs()
        raise
    forward_go_logs()  # what joining logged
    agent = TensorPipeAgent(starter.Agent(), options.num_worker_threads, options.rpc_timeout, is_static_group=world_size > 0)
    # Rank 0's torch store must outlive the join: a dynamic world's later members meet there.
    agent.torch_meeting = meeting
    agent.metrics_address = _serve_metrics(agent)
    return agent


METRICS_PORT_ENV = "TENSORPLAY_RPC_METRICS_PORT"


def _serve_metrics(agent: TensorPipeAgent) -> Optional[str]:
    """Serve the worker's metrics to Prometheus if TENSORPLAY_RPC_METRICS_PORT asks, on that
    port plus the worker's LOCAL_RANK (one port per worker of a machine); the address, or
    None. A port that cannot be served is a warning: metrics must not stop a world."""
    base = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not base:
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    try:
        addr: str = agent._go_agent.ServeMetrics(base, local_rank)
    except RuntimeError as e:
        logger.warning("%s=%s: no Prometheus endpoint: %s", METRICS_PORT_ENV, base, e)
        return None
    logger.info("serving Prometheus metrics at http://%s/metrics", addr)
    return addr

"""Future: the result of an asynchronous call, as ``torch.futures.Future`` defines it."""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import importlib
import itertools
import logging
import os
import sys
import threading
from typing import Any, Callable, Deque, Dict, Generator, Generic, List, NoReturn, Optional, Tuple, TypeVar

from .constants import WAIT_SLICE_S
from .internal import exception_text

__all__ = ["Future", "collect_all", "wait_all"]

T = TypeVar("T")
S = TypeVar("S")
C = TypeVar("C", bound=Callable[..., Any])

logger = logging.getLogger(__name__)


# The most threads that run callbacks at once, and how long one waits idle before it ends.
# Each callback thread is made only when every other one is busy: a slow callback holds up only
# its own future's later callbacks, and a callback that waits on another future (whose callbacks
# need a thread too) finds one. torch runs them on its 16 agent threads.
CALLBACK_THREADS_MAX = 64
CALLBACK_IDLE_EXIT_S = 10.0


class _CallbackThreads:
    """A pool of threads for the callbacks of futures no thread of the caller's should run:
    grows when every thread is busy (up to ``max_threads``) and shrinks as threads stay idle.
    Idle threads block on a condition (no polling)."""

    def __init__(self, max_threads: int, idle_exit_s: float) -> None:
        self._max_threads = max_threads
        self._idle_exit_s = idle_exit_s
        self._names = itertools.count()
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._all_done = threading.Condition(self._lock)  # no task queued or running
        self._tasks: Deque[Callable[[], None]] = collections.deque()
        self._threads = 0
        self._idle = 0  # threads waiting for a task, woken or not
        self._running = 0
        self._warned = False
        self._mine = threading.local()  # .yes on this pool's threads

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task()`` on a callback thread (errors it raises are logged)."""
        with self._lock:
            self._tasks.append(task)
            if len(self._tasks) <= self._idle:  # an idle thread is left for it
                self._cond.notify()
                return
            if self._threads >= self._max_threads:
                if not self._warned:
                    self._warned = True
                    logger.warning("all %d callback threads are busy: futures' callbacks wait for one", self._threads)
                return
            self._threads += 1
        thread = threading.Thread(target=self._work, name=f"tensorplay-rpc-callbacks-{next(self._names)}", daemon=True)
        try:
            thread.start()
        except BaseException:  # no thread to be had: the busy ones take the task later
            with self._lock:
                self._threads -= 1
            raise

    def _work(self) -> None:
        self._mine.yes = True
        while True:
            with self._lock:
                while not self._tasks:
                    self._idle += 1
                    woken = self._cond.wait(self._idle_exit_s)
                    self._idle -= 1
                    if not woken and not self._tasks:
                        self._threads -= 1
                        return
                task = self._tasks.popleft()
                self._running += 1
            try:
                task()
            except BaseException:  # this thread must not die of a task's error
                logger.exception("running a future's callbacks failed")
            finally:
                with self._lock:
                    self._running -= 1
                    if not self._running and not self._tasks:
                        self._all_done.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no task is queued or running (on one of this
        pool's threads, until it is the only one running); report whether none is."""
        own = 1 if getattr(self._mine, "yes", False) else 0
        with self._lock:
            return self._all_done.wait_for(lambda: self._running <= own and not self._tasks, timeout)

    def busy(self) -> int:
        """Threads running a task now (for tests and debug info)."""
        with self._lock:
            return self._running


_callback_threads = _CallbackThreads(CALLBACK_THREADS_MAX, CALLBACK_IDLE_EXIT_S)
# A child made by fork has none of the parent's threads.
os.register_at_fork(after_in_child=_callback_threads._reset)


def run_on_callback_thread(task: Callable[[], None]) -> None:
    """Run ``task()`` on one of the threads that run futures' callbacks, soon: on an idle one,
    or a new one if all are busy (errors it raises are logged)."""
    _callback_threads.submit(task)


def wait_for_callbacks(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until the callback threads have nothing left to run (the
    caller's own task aside, if it is one); report whether they have."""
    return _callback_threads.wait_idle(timeout)


# Set while this thread runs the callbacks a waiting thread may run (Future._drain): a future
# they complete hands its own user callbacks to the callback threads as well.
_on_waiter = threading.local()


def library_callback(callback: C) -> C:
    """Mark ``callback``, this library's own, as one that neither blocks nor runs user code:
    a thread that waits on a future may run it itself, saving a hand-off (see Future._drain)."""
    setattr(callback, "_tensorplay_rpc_on_waiter", True)
    return callback


def _runs_on_waiter(callback: Callable[..., Any]) -> bool:
    return getattr(callback, "_tensorplay_rpc_on_waiter", False) is True


# torch.futures.Future once init_rpc has seen the program use torch (use_torch_futures): the
# futures handed to user code are then instances of it as well, so torch.futures.wait_all,
# collect_all and isinstance checks take them.
_torch_future: Any = None  # the class, typed loosely: torch is optional
_torch_flavours: Dict[type, type] = {}


def use_torch_futures() -> None:
    """If the program has imported torch, make the futures handed to user code from now on
    ``torch.futures.Future`` instances too (a program that never imports torch does not pay
    for importing it)."""
    global _torch_future
    if "torch" in sys.modules and _torch_future is None:
        _torch_future = importlib.import_module("torch.futures").Future
        _hook_torch_waits(importlib.import_module("torch._C"))


# The functions of torch._C through which torch waits on futures' torch state: what
# torch.futures.collect_all and wait_all call (with a list; it returns at once) and what
# torch.jit.wait calls (with one future; it blocks holding the GIL).
_TORCH_WAITS = {"_collect_all": False, "wait": True}


def _hook_torch_waits(torch_c: Any) -> None:
    """Have torch's functions that wait on futures tell ours first (``_before_torch_wait``): a
    call's future fills its torch state only when settled, which a thread of ours usually does
    itself, so the event thread settles it only a while after it completes unless asked."""
    for name, blocking in _TORCH_WAITS.items():
        original = getattr(torch_c, name, None)
        if original is None or getattr(original, "_tensorplay_rpc_hook", False):
            continue

        def hooked(arg: Any, *rest: Any, _original: Any = original, _blocking: bool = blocking) -> Any:
            for future in ((arg,) if _blocking else arg):
                before = getattr(future, "_before_torch_wait", None)
                if before is not None:
                    before(_blocking)
            return _original(arg, *rest)

        hooked._tensorplay_rpc_hook = True  # type: ignore[attr-defined]
        hooked.__doc__ = original.__doc__
        setattr(torch_c, name, hooked)


def _torch_flavour(cls: type, torch_future: Any) -> type:
    """``cls`` with ``torch_future`` as a further base: this module's methods first, and
    completion mirrored into the torch future's state, which torch's functions read."""
    flavour = _torch_flavours.get(cls)
    if flavour is None:
        c_future: Any = torch_future.__mro__[1]  # torch._C.Future, whose methods read that state
        ours: Any = cls

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            c_future.__init__(self, [])
            ours.__init__(self, *args, **kwargs)
            self._torch_looks = False  # one of torch's waits has been handed this future
            self._mirrored = False

        def _mirror(self: Any, result: Any, exception: Optional[BaseException]) -> None:
            # Only once torch looks: most futures are waited on through our methods alone, and
            # copying every outcome into torch's state cost a call a fifth of its time.
            if self._torch_looks:
                self._mirror_now()

        def _mirror_now(self: Any) -> None:
            with self._lock:
                if self._mirrored or not self._done:
                    return
                self._mirrored = True
                result, exception = self._result, self._exception
            if exception is None:
                c_future.set_result(self, result)
            else:  # as torch's own set_exception: the error is a value its waits raise
                c_future._set_unwrap_func(self, _raise)
                c_future.set_result(self, _without_traceback(exception))

        flavour = type(cls.__name__, (cls, torch_future), {
            "__init__": __init__, "_mirror": _mirror, "_mirror_now": _mirror_now,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        })
        _torch_flavours[cls] = flavour
    return flavour


def _raise(exception: BaseException) -> NoReturn:
    raise exception


def _without_traceback(exception: BaseException) -> BaseException:
    """What torch's state holds of a failure: the exception without its traceback, whose
    frames may hold the future itself in a cycle through C++ that Python's GC cannot see."""
    if exception.__traceback__ is None:
        return exception
    try:
        return copy.copy(exception)  # args and attributes; no traceback, cause or context
    except Exception:
        return exception


class Future(Generic[T]):
    """A value, or an exception, that will be available later.

    Callbacks added with :meth:`then` or :meth:`add_done_callback` run in the order they were
    added: on the thread that completes the future with :meth:`set_result` or
    :meth:`set_exception`, or at once if the future is already complete and its callbacks have
    run (as torch's). The callbacks of an RPC's future run on a thread of the library's: never
    inside the ``wait()`` or ``done()`` of a thread waiting on it (a callback may need a lock the
    waiter holds), and a slow one delays no other future's callbacks.
    Once ``init_rpc`` has seen the program use torch, futures are ``torch.futures.Future``
    instances too.
    """

    # Futures never handed to user code stay plain: their values need no copy in torch's state.
    _internal = False

    def __new__(cls, *args: Any, **kwargs: Any) -> "Future[T]":
        torch_future = _torch_future
        if torch_future is None or cls._internal:
            return super().__new__(cls)
        flavour = cls if issubclass(cls, torch_future) else _torch_flavour(cls, torch_future)
        future: Future[T] = torch_future.__new__(flavour)
        return future

    def __init__(self, *, devices: Optional[List[Any]] = None) -> None:
        if devices:
            raise ValueError("tensorplay_rpc futures hold no device state: devices must be empty")
        self._lock = threading.Lock()
        # Made by the first thread that must wait (most futures are done before anyone waits
        # on them): a Condition costs more to build than the rest of a small call's future.
        self._cond: Optional[threading.Condition] = None
        self._done = False
        self._result: Any = None
        self._exception: Optional[BaseException] = None
        self._callbacks: List[Callable[["Future[T]"], None]] = []
        # Set while the callbacks present at completion are being run: callbacks added
        # meanwhile queue behind them, so they keep their order.
        self._draining = False
        # The futures whose completion completes this one (then, collect_all): wait() waits on
        # them first, in this thread, so a future of a call collects its reply here instead of
        # waiting for the event thread to notice it (its callbacks still run elsewhere).
        self._sources: Tuple["Future[Any]", ...] = ()
        self._unwrap: Optional[Callable[[Any], Any]] = None

    def done(self) -> bool:
        """Whether the future has a result or an exception."""
        return self._done

    def _before_torch_wait(self, blocking: bool) -> None:
        """A torch function is about to wait on this future's torch state: from now on the
        outcome is copied there (at once if it is in). One that blocks holding the GIL
        (torch.jit.wait) would wait forever for a completion that needs it, so the future is
        completed here first; torch's function then raises its error, if any."""
        self._torch_looks = True
        self._mirror_now()
        if blocking and not self._done:
            with contextlib.suppress(Exception):
                self.wait()

    def wait(self) -> T:
        """Block until the future completes; return its value or raise its exception."""
        waited: List["Future[Any]"] = []
        # Read again after each wait: a source's callback may name a new one (a proxy's call,
        # made once the value's type is known).
        while self._sources and not self._done:  # most futures have none: no list is built
            pending = [s for s in self._sources if not any(s is w for w in waited)]
            if not pending:
                break
            for source in pending:
                waited.append(source)
                try:
                    source.wait()
                except Exception:  # its callbacks have run: this future carries the outcome
                    pass
        if not self._done:
            with self._lock:
                if self._cond is None:
                    self._cond = threading.Condition(self._lock)
                while not self._done:
                    self._cond.wait(WAIT_SLICE_S)
        return self.value()

    def value(self) -> T:
        """The value of a completed future; raises its exception if it failed."""
        if not self._done:
            raise RuntimeError("Future.value() called before the future completed: call wait() first")
        if self._exception is not None:
            raise self._exception
        if self._unwrap is not None:
            self._unwrap(self._result)  # for its checks (it may raise): its result is not used
        result: T = self._result  # held as Any: a failed future holds None
        return result

    def __await__(self) -> Generator[Any, None, T]:
        """``await fut`` in a coroutine: the event loop goes on while the future is pending, and
        the value is returned (or the exception raised) there. Cancelling the awaiting task
        leaves the future as it is."""
        import asyncio  # only code that awaits pays for it

        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def settle(_: "Future[T]") -> None:
            if not waiter.cancelled():
                try:
                    waiter.set_result(None)
                except asyncio.InvalidStateError:  # cancelled meanwhile
                    pass

        @library_callback
        def on_done(_: "Future[T]") -> None:
            try:
                loop.call_soon_threadsafe(settle, self)
            except RuntimeError:  # the loop was closed: no one awaits any more
                pass

        self.add_done_callback(on_done)
        # An await given up (a cancelled task, wait_for's timeout) takes its callback back: a
        # loop polling a long call must not pile them up.
        waiter.add_done_callback(lambda w: self._discard_callback(on_done) if w.cancelled() else None)
        yield from waiter.__await__()
        return self.value()

    def _discard_callback(self, callback: Callable[["Future[T]"], None]) -> None:
        """Forget ``callback`` if it has not run yet."""
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def then(self, callback: Callable[["Future[T]"], S]) -> "Future[S]":
        """Return a future of ``callback(self)``, run once this future completes. If the
        callback raises, the returned future fails with a RuntimeError that names the
        callback's error (as torch's does); that error is its ``__cause__``."""
        _check_callable("then", callback)
        return self._chain(callback, wrap_errors=True, library=False)

    def _set_unwrap_func(self, unwrap: Callable[[Any], Any]) -> None:
        """Make :meth:`wait` and :meth:`value` call ``unwrap(result)`` before they return the
        result, which it may refuse by raising (as torch's private method of the same name)."""
        self._unwrap = unwrap

    def _chain(self, callback: Callable[["Future[T]"], S], wrap_errors: bool = False, library: bool = True) -> "Future[S]":
        """:meth:`then`; without ``wrap_errors`` the chained future fails with the callback's
        own error (what this library's own chains need). ``library``: the callback is this
        library's own (see library_callback)."""
        chained: Future[S] = Future()

        def run(fut: "Future[T]") -> None:
            try:
                result = callback(fut)
            except BaseException as exc:  # the chained future carries it to its waiter
                if wrap_errors:
                    wrapped = RuntimeError(f"Got the following error when running the callback: {type(exc).__name__}: {exception_text(exc)}")
                    wrapped.__cause__ = exc
                    exc = wrapped
                chained._complete(None, exc)
            else:
                chained._complete(result, None)

        chained._sources = (self,)
        self.add_done_callback(library_callback(run) if library else run)
        return chained

    def add_done_callback(self, callback: Callable[["Future[T]"], None]) -> None:
        """Run ``callback(self)`` once this future completes; errors it raises are logged."""
        _check_callable("add_done_callback", callback)
        with self._lock:
            if not self._done or self._draining:
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def set_result(self, result: T) -> None:
        """Complete the future with ``result``."""
        if not self._complete(result, None):
            raise RuntimeError(
                "Attempting to mark a completed Future as complete again. "
                "Note that a Future can only be marked completed once."
            )

    def set_exception(self, result: BaseException) -> None:
        """Complete the future with an exception, which :meth:`wait` will raise."""
        if not isinstance(result, BaseException):
            raise AssertionError(f"{result} is of type {type(result)}, not an Exception.")
        if not self._complete(None, result):
            raise RuntimeError(
                "Attempting to mark a completed Future as complete again. "
                "Note that a Future can only be marked completed once."
            )

    def _complete(self, result: Any, exception: Optional[BaseException], waiter: bool = False) -> bool:
        """Complete the future unless it already is; report whether this call did it.
        ``waiter``: the calling thread is one waiting on a future (in ``wait()`` or ``done()``),
        which must not run user callbacks (see :meth:`_drain`)."""
        with self._lock:
            if self._done:
                return False
            self._result, self._exception = result, exception
            self._done = True
            draining = self._draining = bool(self._callbacks)
            if self._cond is not None:
                self._cond.notify_all()
        self._mirror(result, exception)
        if draining:
            self._drain(waiter or getattr(_on_waiter, "active", False))
        return True

    def _drain(self, waiter: bool) -> None:
        """Run the callbacks in order until none is left (those added meanwhile too).

        On a ``waiter`` thread only the library's own callbacks run here; from the first other
        one on, the rest run, in order, on a callback thread: the waiter may hold a lock a
        callback takes, and user code must not run inside its ``wait()`` or ``done()``.
        """
        previous = getattr(_on_waiter, "active", False)
        if waiter:
            _on_waiter.active = True
        try:
            while True:
                with self._lock:
                    if not self._callbacks:
                        self._draining = False
                        return
                    callback = self._callbacks[0]
                    if waiter and not _runs_on_waiter(callback):
                        break
                    del self._callbacks[0]
                self._run_callback(callback)
        finally:
            if waiter:
                _on_waiter.active = previous
        run_on_callback_thread(functools.partial(self._drain, False))

    def _mirror(self, result: Any, exception: Optional[BaseException]) -> None:
        """Copy the outcome into torch's state, if torch looks at it (a future that is a
        torch one too, _torch_flavour)."""

    def _mirror_now(self) -> None:
        """Copy the outcome, if it is in, into torch's state (_torch_flavour)."""

    def _run_callback(self, callback: Callable[["Future[T]"], None]) -> None:
        # Any exception, SystemExit and KeyboardInterrupt too: the other callbacks still run,
        # and the thread running them (a callback thread) must not die.
        try:
            callback(self)
        except BaseException:
            logger.exception("a Future's done callback raised; the error is ignored")

    def __reduce__(self) -> NoReturn:
        # A future holds threads' waits and callbacks: it has no meaning on another worker.
        raise RuntimeError("Can not pickle tensorplay_rpc.Future")

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<tensorplay_rpc.Future {state}>"


class InternalFuture(Future[T]):
    """A future this library keeps to itself: never a torch one."""

    _internal = True


def adopt(future: Any) -> Future[Any]:
    """``future`` as one of this module's: itself, or one completed with a torch future's
    outcome (a torch.futures.Future that user code made)."""
    if isinstance(future, Future):
        return future
    adopted: Future[Any] = Future()

    def settle(done: Any) -> None:
        try:
            adopted._complete(done.wait(), None)
        except BaseException as exc:  # the torch future failed: so does this one
            adopted._complete(None, exc)

    future.add_done_callback(settle)
    return adopted


def _adopt_all(futures: List[Any], where: str) -> List[Future[Any]]:
    """``futures`` adopted (adopt), once every one is shown to be a future: anything else is
    refused, naming it, before any callback is added to the others."""
    for i, f in enumerate(futures):
        # Ours, or torch's (whatever made it: any future with these methods is adopted).
        if not isinstance(f, Future) and not (callable(getattr(f, "add_done_callback", None)) and callable(getattr(f, "wait", None))):
            raise TypeError(f"{where}: futures[{i}] is of type {type(f).__name__}, not a Future")
    return [adopt(f) for f in futures]


def is_torch_future(value: Any) -> bool:
    """Whether ``value`` is a torch future (one of ours made so by use_torch_futures, or
    torch's own)."""
    return _torch_future is not None and isinstance(value, _torch_future.__mro__[1])


def is_future(value: Any) -> bool:
    """Whether ``value`` is one of this module's futures or a torch future."""
    if isinstance(value, Future):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch._C.Future)


def _check_callable(method: str, callback: Any) -> None:
    """Refuse a callback that cannot be called at once, as torch does, not when it would run."""
    if not callable(callback):
        raise TypeError(f"{method}(): the callback must be callable, got {type(callback).__name__}")


def collect_all(futures: List[Future[Any]]) -> Future[List[Future[Any]]]:
    """A future that completes once all of ``futures`` have: with their list, or, as torch's,
    with the error of the first of them (in list order) that failed."""
    given = list(futures)
    futures = _adopt_all(given, "collect_all")
    combined: Future[List[Future[Any]]] = Future()
    combined._sources = tuple(futures)
    remaining = [len(futures)]
    lock = threading.Lock()
    if not futures:
        combined.set_result([])
        return combined

    @library_callback
    def one_done(_: Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if not last:
            return
        failed = next((f._exception for f in futures if f._exception is not None), None)
        if failed is not None:
            combined.set_exception(failed)
        else:
            combined.set_result(given)

    for fut in futures:
        fut.add_done_callback(one_done)
    return combined


def wait_all(futures: List[Future[Any]]) -> List[Any]:
    """Wait for every future and return their values; once all are done, raises the error of
    the first (in list order) that failed."""
    futures = _adopt_all(list(futures), "wait_all")
    # Each in turn, not through collect_all: its callback on each future would queue behind
    # the future's own callbacks, which may wait for a lock this thread holds.
    for fut in futures:
        try:
            fut.wait()
        except Exception:  # raised below, once all are done
            pass
    return [fut.wait() for fut in futures]

"""Future: the result of an asynchronous call, as ``torch.futures.Future`` defines it."""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import sys
import threading
from typing import Any, Callable, Dict, Generator, Generic, List, NoReturn, Optional, Tuple, TypeVar

from .constants import WAIT_SLICE_S
from .internal import exception_text

__all__ = ["Future", "collect_all", "wait_all"]

T = TypeVar("T")
S = TypeVar("S")

logger = logging.getLogger(__name__)


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

        def _mirror(self: Any, result: Any, exception: Optional[BaseException]) -> None:
            if exception is None:
                c_future.set_result(self, result)
            else:  # as torch's own set_exception: the error is a value its waits raise
                c_future._set_unwrap_func(self, _raise)
                c_future.set_result(self, _without_traceback(exception))

        flavour = type(cls.__name__, (cls, torch_future), {
            "__init__": __init__, "_mirror": _mirror, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
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
    added, on the thread that completes the future (or at once if it is already complete).
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
        # The futures whose completion completes this one (then, collect_all): wait() waits on
        # them first, in this thread, so a future of a call collects its reply here and runs
        # the callbacks, instead of waiting for the thread that runs callbacks, which may be the
        # very thread waiting (a callback that waits on a nested call).
        self._sources: Tuple["Future[Any]", ...] = ()
        self._unwrap: Optional[Callable[[Any], Any]] = None

    def done(self) -> bool:
        """Whether the future has a result or an exception."""
        return self._done

    def _before_torch_wait(self, blocking: bool) -> None:
        """A torch function is about to wait on this future's torch state. One that blocks
        holding the GIL (torch.jit.wait) would wait forever for a completion that needs it, so
        the future is completed here first; torch's function then raises its error, if any."""
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
        return self._chain(callback, wrap_errors=True)

    def _set_unwrap_func(self, unwrap: Callable[[Any], Any]) -> None:
        """Make :meth:`wait` and :meth:`value` call ``unwrap(result)`` before they return the
        result, which it may refuse by raising (as torch's private method of the same name)."""
        self._unwrap = unwrap

    def _chain(self, callback: Callable[["Future[T]"], S], wrap_errors: bool = False) -> "Future[S]":
        """:meth:`then`; without ``wrap_errors`` the chained future fails with the callback's
        own error (what this library's own chains need)."""
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
        self.add_done_callback(run)
        return chained

    def add_done_callback(self, callback: Callable[["Future[T]"], None]) -> None:
        """Run ``callback(self)`` once this future completes; errors it raises are logged."""
        _check_callable("add_done_callback", callback)
        with self._lock:
            if not self._done:
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

    def _complete(self, result: Any, exception: Optional[BaseException]) -> bool:
        """Complete the future unless it already is; report whether this call did it."""
        with self._lock:
            if self._done:
                return False
            self._result, self._exception = result, exception
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
            if self._cond is not None:
                self._cond.notify_all()
        self._mirror(result, exception)
        for callback in callbacks:
            self._run_callback(callback)
        return True

    def _mirror(self, result: Any, exception: Optional[BaseException]) -> None:
        """Copy the outcome into torch's state (a future that is a torch one too)."""

    def _run_callback(self, callback: Callable[["Future[T]"], None]) -> None:
        # Any exception, SystemExit and KeyboardInterrupt too: the other callbacks still run,
        # and the thread running them (the event thread) must not die.
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
    futures = [adopt(f) for f in given]
    combined: Future[List[Future[Any]]] = Future()
    combined._sources = tuple(futures)
    remaining = [len(futures)]
    lock = threading.Lock()
    if not futures:
        combined.set_result([])
        return combined

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
    futures = [adopt(f) for f in futures]
    collect_all(futures).wait()
    return [fut.wait() for fut in futures]

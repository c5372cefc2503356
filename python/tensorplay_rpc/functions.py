"""Decorators for functions run through RPC."""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Tuple, TypeVar

from .futures import Future, adopt, is_future
from .internal import FrameworkError

__all__ = ["Deferred", "async_execution", "is_async_execution", "run_function"]

F = TypeVar("F", bound=Callable[..., Any])


def async_execution(fn: F) -> F:
    """Mark ``fn`` as returning a :class:`~tensorplay_rpc.Future`: the callee sends the reply
    when that future completes, without holding one of its threads while it waits.

    It works through ``rpc_sync``, ``rpc_async`` and ``remote``. On static and class methods,
    put ``@staticmethod`` or ``@classmethod`` outermost, as torch requires::

        class Ops:
            @staticmethod
            @rpc.functions.async_execution
            def add_later(to, x, y):
                return rpc.rpc_async(to, operator.add, args=(x, y))
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    # The marker torch uses, so code that checks for it works the same here.
    wrapper._wrapped_async_rpc_function = fn  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def is_async_execution(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (or the function a bound method wraps) is marked by
    :func:`async_execution`."""
    return getattr(fn, "_wrapped_async_rpc_function", None) is not None


class Deferred:
    """What a request handler returns to reply later: the reply is the outcome of ``future``,
    sent when it completes."""

    __slots__ = ("future",)

    def __init__(self, future: Future[Any]) -> None:
        self.future = future


def run_function(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Run ``fn(*args, **kwargs)`` for an incoming request: its result, or for an
    :func:`async_execution` function a :class:`Deferred` of the Future it returned."""
    result = fn(*args, **kwargs)
    if not is_async_execution(fn):
        return result
    if not is_future(result):
        raise FrameworkError(
            "Functions decorated with @rpc.async_function must return a tensorplay_rpc.Future object, "
            f"but got {type(result).__module__}.{type(result).__qualname__}"
        )
    return Deferred(adopt(result))

"""RRef proxies: ``rref.rpc_sync().method(...)`` and friends run methods of the value on its
owner."""

from __future__ import annotations

from typing import Any, Callable

from .functions import is_async_execution
from .futures import Future
from .internal import Deferred


def _invoke_rref_method(rref, method_name: str, args: tuple, kwargs: dict) -> Any:
    """Run on the owner: call the value's method; an async_execution method replies when its
    future completes."""
    method = getattr(rref.local_value(), method_name)
    result = method(*args, **kwargs)
    if is_async_execution(method):
        if not isinstance(result, Future):
            raise TypeError(f"async_execution method {method_name} must return a Future, got {type(result).__name__}")
        return Deferred(result)
    return result


class RRefProxy:
    """Turns attribute access into a call of the value's method on the owner, made with one of
    ``rpc_sync``, ``rpc_async`` or ``remote``."""

    def __init__(self, rref, rpc_api: str, timeout: float) -> None:
        self._rref = rref
        self._rpc_api = rpc_api
        self._timeout = timeout

    def __getattr__(self, method_name: str) -> Callable[..., Any]:
        from . import api

        send = getattr(api, self._rpc_api)
        rref, timeout = self._rref, self._timeout

        def call(*args: Any, **kwargs: Any) -> Any:
            return send(rref.owner(), _invoke_rref_method, args=(rref, method_name, args, kwargs), timeout=timeout)

        call.__name__ = method_name
        return call

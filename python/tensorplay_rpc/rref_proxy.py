"""RRef proxies: ``rref.rpc_sync().method(...)`` and friends run methods of the value on its
owner."""

from __future__ import annotations

from typing import Any, Callable

from ._agent import FunctionCall, function_call
from .functions import run_function
from .worker_info import WorkerInfo

# How a proxy sends: rpc_sync, rpc_async or remote, given the owner, the call and the timeout.
Send = Callable[[WorkerInfo, FunctionCall, float], Any]


def _invoke_rref_method(rref: Any, method_name: str, args: tuple, kwargs: dict) -> Any:
    """Run on the owner: call the value's method; an async_execution method replies when its
    future completes."""
    return run_function(getattr(rref.local_value(), method_name), args, kwargs)


class RRefProxy:
    """Turns attribute access into a call of the value's method on the owner, sent with
    ``send`` (the agent's rpc_sync or rpc_async, or remote)."""

    def __init__(self, rref: Any, send: Send, timeout: float) -> None:
        self._rref = rref
        self._send = send
        self._timeout = timeout

    def __getattr__(self, method_name: str) -> Callable[..., Any]:
        rref, send, timeout = self._rref, self._send, self._timeout

        def call(*args: Any, **kwargs: Any) -> Any:
            message = function_call(_invoke_rref_method, (rref, method_name, args, kwargs), None)
            return send(rref.owner(), message, timeout)

        call.__name__ = method_name
        return call

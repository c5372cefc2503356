"""RRef proxies: ``rref.rpc_sync().method(...)`` and friends run methods of the value on its
owner."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from ._agent import FunctionCall, collect_for_wait_all, function_call
from .functions import run_function
from .futures import Future
from .worker_info import WorkerInfo

__all__ = ["RRefProxy", "Send"]

# How a proxy sends: rpc_sync, rpc_async or remote, given the owner, the call and the timeout.
Send = Callable[[WorkerInfo, FunctionCall, float], Any]


def _invoke_rref_method(rref: Any, method_name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Run on the owner: call the value's method; an async_execution method replies when its
    future completes."""
    return run_function(getattr(rref.local_value(), method_name), args, kwargs)


class RRefProxy:
    """Turns attribute access into a call of the value's method on the owner, sent with
    ``send`` (the agent's rpc_sync or rpc_async, or remote).

    As torch's proxies, a method is looked up on the value's type first (``RRef._get_type``,
    one round trip per RRef, then cached), so a missing one raises AttributeError naming it
    at the call. ``blocking=False`` (rpc_async) waits for nothing: the call returns a Future
    at once, and a missing method fails that Future."""

    def __init__(self, rref: Any, send: Send, timeout: float, blocking: bool = True) -> None:
        self._rref = rref
        self._send = send
        self._timeout = timeout
        self._blocking = blocking

    def __getattr__(self, method_name: str) -> Callable[..., Any]:
        rref, send, timeout, blocking = self._rref, self._send, self._timeout, self._blocking

        def call(*args: Any, **kwargs: Any) -> Any:
            message = function_call(_invoke_rref_method, (rref, method_name, args, kwargs), None)
            if blocking:
                getattr(rref._get_type(timeout), method_name)
                return send(rref._owner_to_call(), message, timeout)
            if rref._type is None:
                fut = _send_once_typed(rref._get_type(timeout, blocking=False), method_name, lambda: send(rref._owner_to_call(), message, timeout))
            elif hasattr(rref._type, method_name):
                fut = send(rref._owner_to_call(), message, timeout)
            else:
                fut = Future()
                try:
                    getattr(rref._type, method_name)
                except AttributeError as exc:
                    fut.set_exception(exc)
            collect_for_wait_all(fut)
            return fut

        call.__name__ = method_name
        return call


def _send_once_typed(rref_type: Future[Any], method_name: str, send: Callable[[], Any]) -> Future[Any]:
    """The future of ``send()`` (an rpc_async), called once ``rref_type`` says the method
    exists."""
    result: Future[Any] = Future()

    def typed(fut: Future[Any]) -> None:
        try:
            getattr(fut.value(), method_name)
            sent: Future[Any] = send()
        except BaseException as exc:
            result.set_exception(exc)
            return
        # A thread waiting on the result collects the call's reply itself (Future.wait).
        result._sources = (sent,)

        def settle(done: Future[Any]) -> None:
            result._complete(done._result, done._exception)

        sent.add_done_callback(settle)

    rref_type.add_done_callback(typed)
    result._sources = (rref_type,)
    return result

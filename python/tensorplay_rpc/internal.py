"""Pickling of calls and results, and remote errors.

Everything a call carries is pickled with protocol 5: buffers that support it travel out of
band, beside the pickle, never copied into it. Functions that can be imported on the callee go
by reference; lambdas, closures and functions defined in ``__main__`` go by value (cloudpickle).
"""

from __future__ import annotations

import pickle
import threading
import traceback
from typing import Any, List, Optional, Tuple

import cloudpickle

PROTOCOL = 5


class SendContext:
    """What pickling a message for one destination collects besides bytes: the RRef forks it
    creates, which must be registered with their owners before the message is sent."""

    __slots__ = ("dest_id", "forks")

    def __init__(self, dest_id: int) -> None:
        self.dest_id = dest_id
        # (owner id, rref id, fork id) per fork, ids as (creator, local) pairs
        self.forks: List[Tuple[int, Tuple[int, int], Tuple[int, int]]] = []


_sending = threading.local()


def current_send_context() -> Optional[SendContext]:
    """The context of the message being pickled on this thread, if any."""
    return getattr(_sending, "context", None)


def serialize(obj: Any, dest_id: int) -> Tuple[bytes, List[pickle.PickleBuffer], SendContext]:
    """Pickle ``obj`` for worker ``dest_id``: the pickle, its out-of-band buffers, and the
    context holding the RRef forks it made."""
    buffers: List[pickle.PickleBuffer] = []
    context = SendContext(dest_id)
    _sending.context = context
    try:
        data = cloudpickle.dumps(obj, protocol=PROTOCOL, buffer_callback=buffers.append)
    finally:
        _sending.context = None
    return data, buffers, context


def raw_buffers(buffers: List[pickle.PickleBuffer]) -> List[memoryview]:
    """The flat bytes of each out-of-band buffer, as they go on the wire."""
    return [b.raw() for b in buffers]


def deserialize(payload, buffers) -> Any:
    """Unpickle what :func:`serialize` made, given the received payload and buffers."""
    return pickle.loads(payload, buffers=buffers)


class Deferred:
    """What a request handler returns to reply later: the reply is the outcome of ``future``
    (a :class:`~tensorplay_rpc.Future`), sent when it completes."""

    __slots__ = ("future",)

    def __init__(self, future) -> None:
        self.future = future


class RemoteException:
    """An exception raised on a callee, as it travels back to the caller.

    The type travels by reference, so the caller gets the same class when it can import it;
    the message carries the remote worker, the exception's repr and the remote traceback.
    """

    __slots__ = ("type_ref", "type_name", "message")

    def __init__(self, type_ref: Optional[bytes], type_name: str, message: str) -> None:
        self.type_ref = type_ref
        self.type_name = type_name
        self.message = message

    @classmethod
    def capture(cls, exc: BaseException, where: str) -> "RemoteException":
        """Describe ``exc``, being handled now on worker ``where`` (a WorkerInfo's repr)."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        message = f"On {where}:\n{exc!r}\n{tb}"
        try:
            # cloudpickle sends a class defined in __main__ by value and brings it back to the
            # caller's own class object if the caller sent it here.
            type_ref = cloudpickle.dumps(type(exc), protocol=PROTOCOL)
        except Exception:  # a class that cannot be pickled: its name and text still go
            type_ref = None
        return cls(type_ref, f"{type(exc).__module__}.{type(exc).__qualname__}", message)

    def encode(self) -> bytes:
        """The wire form, plain data that any caller can unpickle."""
        return pickle.dumps((self.type_ref, self.type_name, self.message), protocol=PROTOCOL)

    @classmethod
    def decode(cls, data) -> "RemoteException":
        """Inverse of :meth:`encode`."""
        type_ref, type_name, message = pickle.loads(data)
        return cls(type_ref, type_name, message)

    def to_exception(self) -> BaseException:
        """The exception to raise on the caller: the remote type when it can be imported and
        built from a message, else a RuntimeError naming the type."""
        exc_type = None
        if self.type_ref is not None:
            try:
                exc_type = pickle.loads(self.type_ref)
            except Exception:
                exc_type = None
        short_name = self.type_name.rsplit(".", 1)[-1]
        if isinstance(exc_type, type) and issubclass(exc_type, BaseException):
            try:
                return exc_type(f"{short_name}: {self.message}")
            except Exception:
                pass
        return RuntimeError(f"{self.type_name}: {self.message}")

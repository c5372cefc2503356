"""The receive node of distributed autograd (_dist_autograd): the node a received tensor that
required grad is made the output of, whose backward hands the gradient to the pass running on
this thread; the leaf every such node takes as input; and each thread's state of what it sends,
receives and collects."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from ._dist_autograd import _Receiving

# A receive node's key: (context id, sender id, message id, index of the tensor in the message).
RecvKey = Tuple[int, int, int, int]


class _ThreadState(threading.local):
    current: Optional[int] = None  # the context RPCs made on this thread are recorded in
    receiving: Optional["_Receiving"] = None  # the envelope being unpickled on this thread
    received: Optional[int] = None  # the context of the request last unpickled here
    collector: Optional[List[Tuple[RecvKey, Any]]] = None  # gradients reaching receive nodes


_thread = _ThreadState()


_torch_parts: Dict[str, Any] = {}
_torch_parts_lock = threading.Lock()


def _torch_part(name: str, make: Callable[[], Any]) -> Any:
    """The part ``name``, made by ``make`` the first time it is needed (torch is optional)."""
    made = _torch_parts.get(name)
    if made is None:
        with _torch_parts_lock:
            made = _torch_parts.get(name)
            if made is None:
                made = _torch_parts[name] = make()
    return made


def _recv_function() -> Any:
    """_RecvRpcBackward."""
    return _torch_part("recv", _make_recv_function)


def _make_recv_function() -> Any:
    import torch

    class _RecvRpcBackward(torch.autograd.Function):  # type: ignore[misc]  # torch is untyped here
        """The receive side of a message: its output is the received tensor (sharing its
        memory, not a view, so it may be changed in place); its backward hands the gradient
        to the pass running on this thread, which sends it to the tensor's sender."""

        @staticmethod
        def forward(ctx: Any, dummy: Any, tensor: Any, key: RecvKey) -> Any:
            ctx.key = key
            return tensor.detach()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Tuple[None, None, None]:
            collector = _thread.collector
            if collector is None:
                raise RuntimeError(
                    f"a tensor received in distributed autograd context {ctx.key[0]} was reached by a local "
                    "backward; run tensorplay_rpc.autograd.backward(context_id, roots) instead"
                )
            collector.append((ctx.key, grad))
            return None, None, None

    return _RecvRpcBackward


def _dummy() -> Any:
    """The leaf every receive node takes as its input, so its output requires grad (and a
    pass that must reach the receive nodes can ask for the leaf's gradient)."""
    return _torch_part("dummy", _make_dummy)


def _make_dummy() -> Any:
    import torch

    return torch.zeros((), requires_grad=True)
